"""The users file (YAML, `users: {name: hash}` and `roles: {name: role}`) and ERNIE_AUTH__USERS: parsing with the
file and line of every problem, and writing it atomically, readable by its owner only.

A role says what a user may do besides chatting: "user" (the default, chat only), "editor" (may also change the
prompt templates in the workshop) or "admin" (everything an editor may)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from backend.accounts.passwords import PasswordHashError, parse_hash
from backend.config import yaml_error_line, yaml_problem
from backend.errors import UsersFileError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
ROLES = ("user", "editor", "admin")
DEFAULT_ROLE = "user"
EDITOR_ROLES = frozenset({"editor", "admin"})  # who may change the prompt templates
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


def check_role(role: str) -> str:
    """Return `role` if it is one of ROLES, else raise ValueError naming them."""
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not known: use one of {', '.join(ROLES)}")
    return role


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


def parse_users_document(text: str, path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Parse the users file text into ({name: hash}, {name: role}); raise UsersFileError naming file and line."""
    fix = f"Fix {path} (or recreate it with `python -m backend add-user NAME`)."
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        line = yaml_error_line(exc)
        where = f", line {line}" if line is not None else ""
        raise UsersFileError(f"{path}{where}: not valid YAML ({yaml_problem(exc)}).", fix) from exc
    if root is None:
        return {}, {}
    if not isinstance(root, yaml.MappingNode):
        raise UsersFileError(f"{path}, line {root.start_mark.line + 1}: expected `users:` at the top.", fix)
    users: dict[str, str] = {}
    roles: dict[str, str] = {}
    for key, value in root.value:
        line = key.start_mark.line + 1
        if key.value not in ("users", "roles"):
            raise UsersFileError(
                f"{path}, line {line}: unknown key {key.value!r} (only `users:` and `roles:` are expected).", fix
            )
        if isinstance(value, yaml.ScalarNode) and value.value in ("", "~", "null"):
            continue
        found, check, form = (
            (users, _check_entry, "name: hash") if key.value == "users" else (roles, _check_role_entry, "name: role")
        )
        if not isinstance(value, yaml.MappingNode):
            raise UsersFileError(f"{path}, line {line}: `{key.value}:` must hold lines of the form `{form}`.", fix)
        for name_node, item_node in value.value:
            line = name_node.start_mark.line + 1
            if not isinstance(name_node, yaml.ScalarNode) or not isinstance(item_node, yaml.ScalarNode):
                raise UsersFileError(f"{path}, line {line}: expected `{form}`.", fix)
            problem = check(name_node.value, item_node.value)
            if problem:
                raise UsersFileError(f"{path}, line {line}: {problem}.", fix)
            if name_node.value in found:
                raise UsersFileError(f"{path}, line {line}: user {name_node.value!r} appears twice.", fix)
            found[name_node.value] = item_node.value
    return users, roles


def _check_role_entry(name: object, role: object) -> str | None:
    """Why a name/role pair is invalid, or None."""
    try:
        check_name(str(name))
        check_role(str(role))
    except ValueError as exc:
        return str(exc)
    return None


def parse_users_env_roles(value: str) -> tuple[dict[str, str], dict[str, str]]:
    """Parse ERNIE_AUTH__USERS ("name:hash[:role],...") into ({name: hash}, {name: role})."""
    users: dict[str, str] = {}
    roles: dict[str, str] = {}
    for number, entry in enumerate((e.strip() for e in value.split(",")), start=1):
        if not entry:
            continue
        name, sep, rest = entry.partition(":")
        stored, _, role = rest.partition(":")  # a hash holds no ":"; what follows one is the role
        problem = _check_entry(name.strip(), stored.strip()) if sep else "expected name:hash"
        if not problem and role:
            problem = _check_role_entry(name.strip(), role.strip())
        if problem:
            raise UsersFileError(
                f"ERNIE_AUTH__USERS, entry {number}: {problem}.",
                "Give name:hash (or name:hash:role) entries separated by commas; "
                "`python -m backend add-user NAME --print` makes one.",
            )
        users[name.strip()] = stored.strip()
        if role:
            roles[name.strip()] = role.strip()
    return users, roles


def read_users_document(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The users and roles in `path` (both {} when it does not exist)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, {}
    except (OSError, UnicodeDecodeError) as exc:
        raise UsersFileError(f"{path}: cannot be read ({exc}).", "Check the file's permissions and encoding.") from exc
    return parse_users_document(text, path)


def write_users_file(path: Path, users: dict[str, str], roles: dict[str, str] | None = None) -> None:
    """Write the users file atomically, readable by its owner only; roles other than the default are kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document: dict[str, dict[str, str]] = {"users": dict(sorted(users.items()))}
    kept = {name: role for name, role in sorted((roles or {}).items()) if role != DEFAULT_ROLE and name in users}
    if kept:
        document["roles"] = kept
    body = yaml.safe_dump(document, sort_keys=False, width=1000)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(HEADER + body)
    os.replace(tmp, path)
