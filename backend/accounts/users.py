"""The users file (YAML, `users: {name: hash}`) and ERNIE_AUTH__USERS: parsing with the file and line of every
problem, and writing it atomically, readable by its owner only."""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from backend.accounts.passwords import PasswordHashError, parse_hash
from backend.errors import UsersFileError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
HEADER = (
    "# Users who may log in to the chat, with salted scrypt hashes of their passwords (never the passwords).\n"
    "# Written by `python -m backend add-user NAME`; the app re-reads this file when it changes.\n"
)


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
        return f"user {name!r}: {exc.message}"
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
