"""Roles (user, editor, admin): kept in the users file's `roles:` section and in ERNIE_AUTH__USERS, set by add-user."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from backend import cli
from backend.accounts.login import Accounts
from backend.accounts.passwords import hash_password
from backend.accounts.users import (
    UsersFileError,
    parse_users_env_roles,
    read_users_document,
    write_users_file,
)

HASH = hash_password("alice-password")


def add_user(argv: list[str], password: str, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr("sys.stdin", io.StringIO(password + "\n"))
    return cli.main(["add-user", *argv, "--password-stdin"])


def test_roles_round_trip_and_the_default_is_not_written(tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    write_users_file(path, {"alice": HASH, "bob": HASH, "carol": HASH}, {"alice": "editor", "bob": "user"})
    text = path.read_text()
    assert "roles:\n  alice: editor\n" in text
    assert yaml.safe_load(text)["roles"] == {"alice": "editor"}, "the default role is not written"
    assert read_users_document(path) == ({"alice": HASH, "bob": HASH, "carol": HASH}, {"alice": "editor"})
    assert read_users_document(path)[0] == {"alice": HASH, "bob": HASH, "carol": HASH}


def test_roles_from_the_environment() -> None:
    assert parse_users_env_roles(f"alice:{HASH}:admin,bob:{HASH}") == ({"alice": HASH, "bob": HASH}, {"alice": "admin"})
    with pytest.raises(UsersFileError, match="entry 1: role 'root' is not known"):
        parse_users_env_roles(f"alice:{HASH}:root")


def test_accounts_know_each_users_role(tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    write_users_file(path, {"alice": HASH, "bob": HASH}, {"alice": "editor"})
    accounts = Accounts(path, env_users=f"carol:{HASH}:admin")
    assert (accounts.role("alice"), accounts.role("bob"), accounts.role("carol")) == ("editor", "user", "admin")
    assert accounts.role("mallory") is None
    path.write_text("users: [\n")  # a damaged file: nobody logs in, so nobody has a role
    assert accounts.role("alice") is None


def test_add_user_sets_a_role_and_keeps_it_on_a_password_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "users.yaml"
    assert add_user(["alice", "--file", str(path), "--role", "editor"], "first-password", monkeypatch) == 0
    assert "Added alice" in capsys.readouterr().out
    assert add_user(["alice", "--file", str(path)], "second-password", monkeypatch) == 0
    assert read_users_document(path)[1] == {"alice": "editor"}, "a password change keeps the role"
    assert add_user(["alice", "--file", str(path), "--role", "user"], "third-password", monkeypatch) == 0
    assert read_users_document(path)[1] == {}
    assert add_user(["bob", "--print", "--role", "admin"], "bob-password", monkeypatch) == 0
    assert capsys.readouterr().out.strip().endswith(":admin")
    before = path.read_bytes()
    with pytest.raises(SystemExit) as refused:
        add_user(["bob", "--file", str(path), "--role", "boss"], "bob-password", monkeypatch)
    assert refused.value.code == 2
    assert path.read_bytes() == before, "an unknown role: the file is left as it was"
    assert set(read_users_document(path)[0]) == {"alice"}


def test_a_users_file_problem_is_catalogued_and_reads_in_chinese(tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    path.write_text("users:\n  bob: 123\n", encoding="utf-8")
    with pytest.raises(UsersFileError) as info:
        read_users_document(path)
    assert info.value.code == "users.bad_entry"
    assert str(info.value).startswith(f"{path}, line 2: user 'bob': not a password hash of the form scrypt$")
    assert info.value.text("zh-CN").startswith(
        f"{path} 第 2 行：用户 'bob'：不是 scrypt$n$r$p$salt$hash 形式的密码哈希。"
    )
