"""The users file (YAML, `users: {name: hash}` and `roles: {name: role}`) and ERNIE_AUTH__USERS: parsing with the
file and line of every problem, and writing it atomically, readable by its owner only.

A role says what a user may do besides chatting: "user" (the default, chat only), "editor" (may also change the
prompt templates in the workshop) or "admin" (everything an editor may)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from backend.accounts.passwords import PasswordHashError, parse_hash
from backend.config import yaml_error_line, yaml_problem
from backend.errors import Phrase, UsersFileError
from backend.files import atomic_write

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
ROLES = ("user", "editor", "admin")
DEFAULT_ROLE = "user"
EDITOR_ROLES = frozenset({"editor", "admin"})  # who may change the prompt templates
HEADER = (
    "# Users who may log in to the chat, with salted scrypt hashes of their passwords (never the passwords).\n"
    "# Written by `python -m backend add-user NAME`; the app re-reads this file when it changes.\n"
)


def name_problem(name: str) -> Phrase | None:
    """Why `name` is not a valid user name (what is allowed), or None."""
    return None if NAME.match(name) else Phrase("users.name_not_allowed", name=name)


def role_problem(role: str) -> Phrase | None:
    """Why `role` is not one of ROLES (naming them), or None."""
    return None if role in ROLES else Phrase("users.role_unknown", role=role, roles=", ".join(ROLES))


def check_name(name: str) -> str:
    """Return `name` if it is a valid user name, else raise ValueError saying what is allowed."""
    if problem := name_problem(name):
        raise ValueError(str(problem))
    return name


def check_role(role: str) -> str:
    """Return `role` if it is one of ROLES, else raise ValueError naming them."""
    if problem := role_problem(role):
        raise ValueError(str(problem))
    return role


def _check_entry(name: object, stored: object) -> Phrase | None:
    """Why a name/hash pair is invalid, or None."""
    if not isinstance(name, str):
        return Phrase("users.name_not_text", name=name)
    if problem := name_problem(name):
        return problem
    if not isinstance(stored, str):
        return Phrase("users.value_not_hash", name=name)
    try:
        parse_hash(stored)
    except PasswordHashError as exc:
        return Phrase("users.bad_hash", name=name, reason=exc)
    return None


def parse_users_document(text: str, path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Parse the users file text into ({name: hash}, {name: role}); raise UsersFileError naming file and line."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        line = yaml_error_line(exc)
        where = Phrase("config.at_line", line=line) if line is not None else ""
        raise UsersFileError.of("users.bad_yaml", path=path, where=where, problem=yaml_problem(exc)) from exc
    if root is None:
        return {}, {}
    if not isinstance(root, yaml.MappingNode):
        raise UsersFileError.of("users.not_a_mapping", path=path, line=root.start_mark.line + 1)
    users: dict[str, str] = {}
    roles: dict[str, str] = {}
    for key, value in root.value:
        line = key.start_mark.line + 1
        if key.value not in ("users", "roles"):
            raise UsersFileError.of("users.unknown_key", path=path, line=line, key=key.value)
        if isinstance(value, yaml.ScalarNode) and value.value in ("", "~", "null"):
            continue
        found, check, form = (
            (users, _check_entry, "name: hash") if key.value == "users" else (roles, _check_role_entry, "name: role")
        )
        if not isinstance(value, yaml.MappingNode):
            raise UsersFileError.of("users.not_lines", path=path, line=line, key=key.value, form=form)
        for name_node, item_node in value.value:
            line = name_node.start_mark.line + 1
            if not isinstance(name_node, yaml.ScalarNode) or not isinstance(item_node, yaml.ScalarNode):
                raise UsersFileError.of("users.bad_line", path=path, line=line, form=form)
            problem = check(name_node.value, item_node.value)
            if problem:
                raise UsersFileError.of("users.bad_entry", path=path, line=line, problem=problem)
            if name_node.value in found:
                raise UsersFileError.of("users.twice", path=path, line=line, name=name_node.value)
            found[name_node.value] = item_node.value
    return users, roles


def _check_role_entry(name: object, role: object) -> Phrase | None:
    """Why a name/role pair is invalid, or None."""
    return name_problem(str(name)) or role_problem(str(role))


def parse_users_env_roles(value: str) -> tuple[dict[str, str], dict[str, str]]:
    """Parse ERNIE_AUTH__USERS ("name:hash[:role],...") into ({name: hash}, {name: role})."""
    users: dict[str, str] = {}
    roles: dict[str, str] = {}
    for number, entry in enumerate((e.strip() for e in value.split(",")), start=1):
        if not entry:
            continue
        name, sep, rest = entry.partition(":")
        stored, _, role = rest.partition(":")  # a hash holds no ":"; what follows one is the role
        problem = _check_entry(name.strip(), stored.strip()) if sep else Phrase("users.expected_pair")
        if not problem and role:
            problem = _check_role_entry(name.strip(), role.strip())
        if problem:
            raise UsersFileError.of("users.env_entry", number=number, problem=problem)
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
        raise UsersFileError.of("users.unreadable", path=path, reason=str(exc)) from exc
    return parse_users_document(text, path)


def write_users_file(path: Path, users: dict[str, str], roles: dict[str, str] | None = None) -> None:
    """Write the users file atomically, readable by its owner only; roles other than the default are kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document: dict[str, dict[str, str]] = {"users": dict(sorted(users.items()))}
    kept = {name: role for name, role in sorted((roles or {}).items()) if role != DEFAULT_ROLE and name in users}
    if kept:
        document["roles"] = kept
    body = yaml.safe_dump(document, sort_keys=False, width=1000)
    atomic_write(path, HEADER + body, mode=0o600)
