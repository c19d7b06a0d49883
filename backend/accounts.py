"""Login: users and their password hashes (users file + ERNIE_AUTH__USERS), the session secret, add-user.

The users file is YAML, `users: {name: hash}`; it is re-read when it changes, so `add-user` works
while the app runs. A damaged file refuses every login (never opens the app) and names the line."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import logging
import os
import re
import secrets
import sys
from pathlib import Path

import yaml

from backend.config import AppConfig, load_config
from backend.errors import ConfigError, ServiceError
from backend.passwords import MIN_LENGTH, PasswordHashError, dummy_hash, hash_password, parse_hash, verify_password

log = logging.getLogger(__name__)

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
SECRET_ENV = "CHAINLIT_AUTH_SECRET"
SECRET_FILE = "auth_secret"
HEADER = (
    "# Users who may log in to the chat, with salted scrypt hashes of their passwords (never the passwords).\n"
    "# Written by `python -m backend add-user NAME`; the app re-reads this file when it changes.\n"
)


class UsersFileError(ServiceError):
    """The users file (or ERNIE_AUTH__USERS) cannot be read; nobody can log in until it is fixed."""

    key = "error.users"


def check_name(name: str) -> str:
    """Return `name` if it is a valid user name, else raise ValueError saying what is allowed."""
    if not NAME.match(name):
        raise ValueError(
            f"user name {name!r} is not allowed: use 1-64 letters, digits and . _ @ - (starting with a letter or digit)"
        )
    return name


def _check_entry(name: object, stored: object) -> str | None:
    """Why a name/hash pair is invalid, or None."""
    if not isinstance(name, str):
        return f"the user name {name!r} must be text"
    try:
        check_name(name)
    except ValueError as exc:
        return str(exc)
    if not isinstance(stored, str):
        return f"user {name!r}: the value must be a password hash (scrypt$...) made by add-user"
    try:
        parse_hash(stored)
    except PasswordHashError as exc:
        return f"user {name!r}: {exc}"
    return None


def parse_users_file(text: str, path: Path) -> dict[str, str]:
    """Parse the users file text; raise UsersFileError naming the file and line of the first problem."""
    fix = f"Fix {path} (or recreate it with `python -m backend add-user NAME`)."
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        raise UsersFileError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)}).", fix) from exc
    if root is None:
        return {}
    if not isinstance(root, yaml.MappingNode):
        raise UsersFileError(f"{path}, line {root.start_mark.line + 1}: expected `users:` at the top.", fix)
    users: dict[str, str] = {}
    for key, value in root.value:
        line = key.start_mark.line + 1
        if key.value != "users":
            raise UsersFileError(f"{path}, line {line}: unknown key {key.value!r} (only `users:` is expected).", fix)
        if isinstance(value, yaml.ScalarNode) and value.value in ("", "~", "null"):
            continue
        if not isinstance(value, yaml.MappingNode):
            raise UsersFileError(f"{path}, line {line}: `users:` must hold lines of the form `name: hash`.", fix)
        for name_node, hash_node in value.value:
            line = name_node.start_mark.line + 1
            if not isinstance(name_node, yaml.ScalarNode) or not isinstance(hash_node, yaml.ScalarNode):
                raise UsersFileError(f"{path}, line {line}: expected `name: hash`.", fix)
            problem = _check_entry(name_node.value, hash_node.value)
            if problem:
                raise UsersFileError(f"{path}, line {line}: {problem}.", fix)
            if name_node.value in users:
                raise UsersFileError(f"{path}, line {line}: user {name_node.value!r} appears twice.", fix)
            users[name_node.value] = hash_node.value
    return users


def parse_users_env(value: str) -> dict[str, str]:
    """Parse ERNIE_AUTH__USERS ("name:hash,name:hash"); raise UsersFileError naming the entry."""
    users: dict[str, str] = {}
    for number, entry in enumerate((e.strip() for e in value.split(",")), start=1):
        if not entry:
            continue
        name, sep, stored = entry.partition(":")
        problem = _check_entry(name.strip(), stored.strip()) if sep else "expected name:hash"
        if problem:
            raise UsersFileError(
                f"ERNIE_AUTH__USERS, entry {number}: {problem}.",
                "Give name:hash pairs separated by commas; `python -m backend add-user NAME --print` makes one.",
            )
        users[name.strip()] = stored.strip()
    return users


def read_users_file(path: Path) -> dict[str, str]:
    """The users in `path` ({} when it does not exist)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise UsersFileError(f"{path}: cannot be read ({exc}).", "Check the file's permissions and encoding.") from exc
    return parse_users_file(text, path)


def write_users_file(path: Path, users: dict[str, str]) -> None:
    """Write the users file atomically, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = yaml.safe_dump({"users": dict(sorted(users.items()))}, sort_keys=False, width=1000)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(HEADER + body)
    os.replace(tmp, path)


def users_file_path(cfg: AppConfig) -> Path:
    return cfg.paths.resolve(cfg.auth.users_file)


class Accounts:
    """Checks passwords against the users file (re-read when it changes) and ERNIE_AUTH__USERS."""

    def __init__(self, users_file: Path, env_users: str | None = None) -> None:
        self.users_file = users_file
        self._env_users = env_users
        self._stamp: tuple[int, int] | None = None
        self._loaded = False
        self._users: dict[str, str] = {}
        self.problem: UsersFileError | None = None
        self._reload()

    @classmethod
    def from_config(cls, cfg: AppConfig) -> Accounts:
        env = cfg.auth.users.get_secret_value() if cfg.auth.users is not None else None
        return cls(users_file_path(cfg), env)

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = self.users_file.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def _reload(self) -> None:
        stamp = self._file_stamp()
        if self._loaded and stamp == self._stamp:
            return
        self._stamp, self._loaded = stamp, True
        try:
            users = read_users_file(self.users_file)
            if self._env_users:
                users.update(parse_users_env(self._env_users))
        except UsersFileError as exc:
            if str(exc) != str(self.problem):
                log.error("%s Nobody can log in until this is fixed.", exc)
            self.problem, self._users = exc, {}
            return
        if self.problem is not None:
            log.info("Users file fixed: %d users can log in.", len(users))
        self.problem, self._users = None, users
        if not users:
            log.error(
                "Login is enabled but no users are defined (%s, ERNIE_AUTH__USERS): "
                "add one with `python -m backend add-user NAME`.",
                self.users_file,
            )

    def names(self) -> list[str]:
        self._reload()
        return sorted(self._users)

    def check(self, name: str, password: str) -> str | None:
        """The user's name when `password` is theirs, else None (a wrong name costs as long as a wrong password)."""
        self._reload()
        stored = self._users.get(name)
        ok = verify_password(password, stored or dummy_hash())
        if stored is None or not ok:
            log.info("Login refused for %r", name[:64])
            return None
        return name

    async def login(self, name: str, password: str) -> str | None:
        """check() off the event loop (scrypt takes ~50 ms of CPU)."""
        return await asyncio.to_thread(self.check, name, password)


def ensure_auth_secret(data_dir: Path, environ: dict[str, str] | os._Environ[str] = os.environ) -> Path | None:
    """Make sure CHAINLIT_AUTH_SECRET is set: from the environment, else from (or into) data_dir/auth_secret.

    Returns the file used, or None when the environment already had it. The secret is never logged."""
    if environ.get(SECRET_ENV):
        return None
    path = data_dir / SECRET_FILE
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            secret = path.read_text(encoding="ascii").strip()
            if path.stat().st_mode & 0o077:
                log.warning("%s is readable by other users: chmod 600 it.", path)
        else:
            secret = secrets.token_urlsafe(48)
            with os.fdopen(fd, "w", encoding="ascii") as out:
                out.write(secret + "\n")
            log.info("Created the login session secret in %s (mode 600).", path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"Cannot read or create the login session secret {path}: {exc}.",
            f"Make the data folder writable, or set {SECRET_ENV} yourself.",
        ) from exc
    if len(secret) < 32:
        raise ConfigError(f"The login session secret in {path} is too short.", "Delete the file to make a new one.")
    environ[SECRET_ENV] = secret
    return path


def setup_login(cfg: AppConfig | None = None) -> Accounts | None:
    """Accounts when login is enabled (and the session secret in place), else None. Called at import by app.py:
    Chainlit decides whether a login page is needed right after importing the app."""
    try:
        cfg = cfg or load_config()
    except ConfigError:
        return None  # the chat reports the configuration error; no login page without a configuration
    if not cfg.auth.enabled:
        return None
    ensure_auth_secret(cfg.paths.data)
    accounts = Accounts.from_config(cfg)
    log.info("Login enabled; users: %d (%s and ERNIE_AUTH__USERS).", len(accounts.names()), accounts.users_file)
    return accounts


def _read_password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass(f"Password for {args.name}: ")
        if getpass.getpass("Again: ") != password:
            raise ValueError("the two passwords differ")
    if len(password) < MIN_LENGTH:
        raise ValueError(f"the password must have at least {MIN_LENGTH} characters")
    return password


def main(argv: list[str] | None = None) -> int:
    """add-user NAME: add a user or change their password in the users file."""
    parser = argparse.ArgumentParser(prog="python -m backend add-user", description=main.__doc__)
    parser.add_argument("name", help="user name (letters, digits, . _ @ -)")
    parser.add_argument("--file", type=Path, help="users file (default: auth.users_file of the configuration)")
    parser.add_argument("--password-stdin", action="store_true", help="read the password from stdin (no prompt)")
    parser.add_argument("--print", action="store_true", help="print name:hash for ERNIE_AUTH__USERS, write nothing")
    args = parser.parse_args(argv)
    try:
        check_name(args.name)
        password = _read_password(args)
    except ValueError as exc:
        print(f"add-user: {exc}", file=sys.stderr)
        return 2
    if args.print:
        print(f"{args.name}:{hash_password(password)}")
        return 0
    cfg: AppConfig | None = None
    try:
        cfg = load_config()
    except ConfigError as exc:
        if args.file is None:  # the configuration names the users file
            print(f"add-user: {exc}", file=sys.stderr)
            return 1
    path: Path = args.file if args.file is not None else users_file_path(cfg)  # type: ignore[arg-type]
    try:
        users = read_users_file(path)
        existed = args.name in users
        users[args.name] = hash_password(password)
        write_users_file(path, users)
    except (ServiceError, OSError) as exc:
        print(f"add-user: {exc}", file=sys.stderr)
        return 1
    print(f"{'Changed the password of' if existed else 'Added'} {args.name} in {path}.")
    if cfg is not None and not cfg.auth.enabled:
        print("Login is off: set auth.enabled: true in config/backend.yaml (or ERNIE_AUTH__ENABLED=true).")
    return 0
