"""Login: checking passwords against the users (backend/accounts/users.py), the session secret, and add-user.

The users file is re-read when it changes, so `add-user` works while the app runs. A damaged file
refuses every login (it never opens the app) and the log names the file and line."""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
import secrets
import sys
from pathlib import Path

from backend.accounts.passwords import MIN_LENGTH, dummy_hash, hash_password, verify_password
from backend.accounts.users import (
    DEFAULT_ROLE,
    UsersFileError,
    check_name,
    check_role,
    parse_users_env_roles,
    read_users_document,
    write_users_file,
)
from backend.config import AppConfig, load_config
from backend.errors import ConfigError, ServiceError

log = logging.getLogger(__name__)

SECRET_ENV = "CHAINLIT_AUTH_SECRET"
SECRET_FILE = "auth_secret"


def users_file_path(cfg: AppConfig) -> Path:
    return cfg.paths.resolve(cfg.auth.users_file)


class Accounts:
    """Checks passwords against the users file (re-read when it changes) and ERNIE_AUTH__USERS."""

    def __init__(self, users_file: Path, env_users: str | None = None, password: bool = True) -> None:
        self.users_file = users_file
        self._env_users = env_users
        self.password = password  # password login on (else the users file only names linked accounts and roles)
        self._stamp: tuple[int, int] | None = None
        self._loaded = False
        self._users: dict[str, str] = {}
        self._roles: dict[str, str] = {}
        self.problem: UsersFileError | None = None
        self._sso: dict[
            str, str | None
        ] = {}  # the organisation's sign-in accounts and roles (backend.api.sso_accounts)
        self._reload()

    @classmethod
    def from_config(cls, cfg: AppConfig) -> Accounts:
        env = cfg.auth.users.get_secret_value() if cfg.auth.users is not None else None
        return cls(users_file_path(cfg), env, cfg.auth.password)

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
            users, roles = read_users_document(self.users_file)
            if self._env_users:
                env_users, env_roles = parse_users_env_roles(self._env_users)
                users.update(env_users)
                roles.update(env_roles)
        except UsersFileError as exc:
            if str(exc) != str(self.problem):
                log.error("%s Nobody can log in until this is fixed.", exc)
            self.problem, self._users, self._roles = exc, {}, {}
            return
        if self.problem is not None:
            log.info("Users file fixed: %d users can log in.", len(users))
        self.problem, self._users, self._roles = None, users, roles
        if not users and self.password:
            log.error(
                "Login is enabled but no users are defined (%s, ERNIE_AUTH__USERS): "
                "add one with `python -m backend add-user NAME`.",
                self.users_file,
            )

    def names(self) -> list[str]:
        self._reload()
        return sorted(self._users)

    def role(self, name: str) -> str | None:
        """The role of the user `name` (users.ROLES), or None when there is no such user (or the file is damaged).

        A users file's entry decides for its name (a password account an admin linked to the organisation's sign-in
        too); else the role the organisation's groups gave at the account's last sign-in."""
        self._reload()
        if name in self._users:
            return self._roles.get(name, DEFAULT_ROLE)
        return self._sso.get(name)

    def password_names(self) -> set[str]:
        """The names of the users file's (and ERNIE_AUTH__USERS') accounts."""
        self._reload()
        return set(self._users)

    def knows(self, name: str) -> bool:
        """Whether `name` is an account this process knows of (the users file's, or the organisation's read so far)."""
        self._reload()
        return name in self._users or name in self._sso

    def know_sso(self, roles: dict[str, str | None], replace: bool = False) -> None:
        """The roles of the organisation's sign-in accounts, as the database has them (`replace`: all of them)."""
        self._sso = dict(roles) if replace else {**self._sso, **roles}

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


def login_metadata(provider: str = "password") -> dict[str, str]:
    """What a login's token carries besides the user's name: the provider (password, oidc, proxy), and an id of its
    own, so that a logout ends this login's token and no later one's (two logins in one second would otherwise get
    equal tokens)."""
    return {"provider": provider, "login": secrets.token_hex(8)}


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
    """Accounts when login is enabled (and the session secret in place), else None. Called as app.py is imported
    (backend.web.hooks): Chainlit decides whether a login page is needed right after importing the app."""
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


def _read_password(name: str, from_stdin: bool) -> str:
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass(f"Password for {name}: ")
        if getpass.getpass("Again: ") != password:
            raise ValueError("the two passwords differ")
    if len(password) < MIN_LENGTH:
        raise ValueError(f"the password must have at least {MIN_LENGTH} characters")
    return password


def add_user_command(
    cfg: AppConfig,
    name: str,
    file: Path | None = None,
    password_stdin: bool = False,
    print_only: bool = False,
    role: str | None = None,
) -> int:
    """`add-user NAME`: add a user or change their password (and role) in the users file (`file`, default
    auth.users_file).

    The password is asked twice, or read from stdin; `print_only` prints name:hash[:role] and writes nothing.
    Without `role` a new user gets the default one and an existing user keeps theirs."""
    try:
        check_name(name)
        if role is not None:
            check_role(role)
        password = _read_password(name, password_stdin)
    except ValueError as exc:
        print(f"add-user: {exc}", file=sys.stderr)
        return 2
    if print_only:
        print(f"{name}:{hash_password(password)}" + (f":{role}" if role and role != DEFAULT_ROLE else ""))
        return 0
    path = file if file is not None else users_file_path(cfg)
    try:
        users, roles = read_users_document(path)
        existed = name in users
        users[name] = hash_password(password)
        if role is not None:
            roles[name] = role
        write_users_file(path, users, roles)
    except (ServiceError, OSError) as exc:
        print(f"add-user: {exc}", file=sys.stderr)
        return 1
    print(
        f"{'Changed the password of' if existed else 'Added'} {name} in {path} (role: {roles.get(name, DEFAULT_ROLE)})."
    )
    if not cfg.auth.enabled:
        print("Login is off: set auth.enabled: true in config/backend.yaml (or ERNIE_AUTH__ENABLED=true).")
    return 0
