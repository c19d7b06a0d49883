"""Login: the users file (errors name file and line), ERNIE_AUTH__USERS, the session secret, add-user."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

import pytest

from backend import cli
from backend.accounts.login import SECRET_ENV, Accounts, ensure_auth_secret, setup_login
from backend.accounts.passwords import hash_password, verify_password
from backend.accounts.users import (
    UsersFileError,
    parse_users_document,
    parse_users_env_roles,
    read_users_document,
    write_users_file,
)
from backend.errors import ConfigError
from tests.conftest import MakeConfig

HASH = hash_password("alice-password")


def add_user(argv: list[str]) -> int:
    """`python -m backend add-user ARGV...`, in process."""
    return cli.main(["add-user", *argv])


def test_users_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    write_users_file(path, {"bob": HASH, "alice": HASH})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert text.startswith("# Users who may log in")
    assert read_users_document(path)[0] == {"alice": HASH, "bob": HASH}
    assert read_users_document(tmp_path / "missing.yaml")[0] == {}
    assert parse_users_document("", path)[0] == {} and parse_users_document("users:\n", path)[0] == {}


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("users:\n  alice: a: b\n", 2, "not valid YAML"),
        ("users:\n  alice: HASH\n  bob: secret123\n", 3, "user 'bob'"),
        ("users:\n  alice: HASH\n  alice: HASH\n", 3, "appears twice"),
        ("users:\n  'bad name': HASH\n", 2, "is not allowed"),
        ("people:\n  alice: x\n", 1, "unknown key 'people'"),
        ("users: alice\n", 1, "name: hash"),
        ("- alice\n", 1, "expected `users:`"),
        ("users:\n  alice:\n    - HASH\n", 2, "expected `name: hash`"),
        # roles (tests/unit/accounts/test_roles.py)
        (
            "users:\n  alice: HASH\nroles:\n  alice: boss\n",
            4,
            "role 'boss' is not known: use one of user, editor, admin",
        ),
        ("users:\n  alice: HASH\nroles: editor\n", 3, "`roles:` must hold lines of the form `name: role`"),
        ("users:\n  alice: HASH\nroles:\n  alice: editor\n  alice: admin\n", 5, "appears twice"),
    ],
)
def test_bad_users_file_names_file_and_line(tmp_path: Path, text: str, line: int, words: str) -> None:
    path = tmp_path / "users.yaml"
    # HASH put in here, not in the parameters: a hash's salt is random, and the test's id must be the same in both
    # test processes of `make test` (pytest-xdist compares what each collected)
    path.write_text(text.replace("HASH", HASH))
    with pytest.raises(UsersFileError) as err:
        read_users_document(path)[0]
    message = str(err.value)
    assert message.startswith(f"{path}, line {line}:"), message
    assert words in message
    assert "add-user" in message  # says how to fix it
    assert "secret123" not in message  # a value that may be a pasted password is not echoed


def test_users_from_environment() -> None:
    other = hash_password("bob-password")
    assert parse_users_env_roles(f"alice:{HASH}, bob:{other},")[0] == {"alice": HASH, "bob": other}
    with pytest.raises(UsersFileError, match="entry 2: expected name:hash"):
        parse_users_env_roles(f"alice:{HASH},bob")[0]
    with pytest.raises(UsersFileError, match="entry 1: user 'alice'"):
        parse_users_env_roles("alice:hunter2")[0]


def test_accounts_check_passwords_and_reload_the_file(tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    write_users_file(path, {"alice": HASH})
    accounts = Accounts(path, env_users=f"carol:{hash_password('carol-password')}")
    assert accounts.names() == ["alice", "carol"]
    assert accounts.check("alice", "alice-password") == "alice"
    assert accounts.check("alice", "wrong") is None
    assert accounts.check("nobody", "alice-password") is None
    assert accounts.check("carol", "carol-password") == "carol"

    write_users_file(path, {"alice": HASH, "bob": hash_password("bob-password")})
    os.utime(path, ns=(1, 1))  # a different mtime even on coarse clocks
    assert accounts.check("bob", "bob-password") == "bob", "the changed file is read again"

    path.write_text("users:\n  bob: a: b\n")
    assert accounts.check("alice", "alice-password") is None, "a damaged file refuses every login"
    assert accounts.problem is not None and "line 2" in str(accounts.problem)
    write_users_file(path, {"alice": HASH})
    assert accounts.check("alice", "alice-password") == "alice"
    assert accounts.problem is None


async def test_login_runs_off_the_event_loop(tmp_path: Path) -> None:
    path = tmp_path / "users.yaml"
    write_users_file(path, {"alice": HASH})
    accounts = Accounts(path)
    assert await accounts.login("alice", "alice-password") == "alice"
    assert await accounts.login("alice", "nope") is None


def test_auth_secret_is_created_once_with_mode_600(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    path = ensure_auth_secret(tmp_path / "data", env)
    assert path == tmp_path / "data" / "auth_secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = env[SECRET_ENV]
    assert len(secret) >= 32 and path.read_text().strip() == secret
    again: dict[str, str] = {}
    ensure_auth_secret(tmp_path / "data", again)
    assert again[SECRET_ENV] == secret, "the same secret after a restart keeps users logged in"


def test_auth_secret_from_environment_wins(tmp_path: Path) -> None:
    env = {SECRET_ENV: "x" * 40}
    assert ensure_auth_secret(tmp_path / "data", env) is None
    assert not (tmp_path / "data").exists()
    assert env[SECRET_ENV] == "x" * 40


def test_auth_secret_problems_are_config_errors(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "auth_secret").write_text("short\n")
    with pytest.raises(ConfigError, match="too short"):
        ensure_auth_secret(tmp_path / "data", {})


def test_setup_login_only_when_enabled(
    make_config: MakeConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, "")  # unset for the test, restored afterwards
    assert setup_login(make_config()) is None
    assert not (tmp_path / "data" / "auth_secret").exists()
    users = tmp_path / "users.yaml"
    write_users_file(users, {"alice": HASH})
    accounts = setup_login(make_config(auth__enabled="true", auth__users_file=str(users)))
    assert accounts is not None and accounts.names() == ["alice"]
    assert os.environ[SECRET_ENV] == (tmp_path / "data" / "auth_secret").read_text().strip()


def test_add_user_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "users.yaml"
    monkeypatch.setattr("sys.stdin", io.StringIO("first-password\n"))
    assert add_user(["alice", "--file", str(path), "--password-stdin"]) == 0
    assert "Added alice" in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO("second-password\n"))
    assert add_user(["alice", "--file", str(path), "--password-stdin"]) == 0
    assert "Changed the password of alice" in capsys.readouterr().out
    users = read_users_document(path)[0]
    assert verify_password("second-password", users["alice"])
    assert "second-password" not in path.read_text()

    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    assert add_user(["bob", "--file", str(path), "--password-stdin"]) == 2
    assert "at least 8 characters" in capsys.readouterr().err
    assert add_user(["bad name", "--file", str(path), "--password-stdin"]) == 2

    monkeypatch.setattr("sys.stdin", io.StringIO("bob-password\n"))
    assert add_user(["bob", "--password-stdin", "--print"]) == 0
    line = capsys.readouterr().out.strip()
    assert verify_password("bob-password", parse_users_env_roles(line)[0]["bob"])


def test_add_user_refuses_a_damaged_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "users.yaml"
    path.write_text("users: [\n")
    monkeypatch.setattr("sys.stdin", io.StringIO("first-password\n"))
    assert add_user(["alice", "--file", str(path), "--password-stdin"]) == 1
    assert f"{path}, line" in capsys.readouterr().err
    assert path.read_text() == "users: [\n", "left as it was"
