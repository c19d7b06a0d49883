"""Who may use the workshop: editors and admins with login on; without login the local machine (or anyone, when
workshop.allow_remote is on). The refusals are catalogued errors in both languages."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.requests import Request

from backend.accounts.login import Accounts
from backend.accounts.passwords import hash_password
from backend.accounts.users import write_users_file
from backend.errors import WorkshopError
from backend.workshop.access import Access, Editor, host_name, is_local
from tests.conftest import MakeConfig


def request(host: str, asked: str = "127.0.0.1:8501", origin: str | None = None) -> Request:
    """A request from `host` for the address `asked` (its Host header), made by a page at `origin` if given."""
    headers = [(b"host", asked.encode())] + ([(b"origin", origin.encode())] if origin else [])
    return Request({"type": "http", "client": (host, 40000), "headers": headers, "method": "GET", "path": "/"})


@pytest.mark.parametrize(
    ("host", "local"),
    [("127.0.0.1", True), ("127.3.4.5", True), ("::1", True), ("::ffff:127.0.0.1", True),
     ("10.0.0.5", False), ("::ffff:10.0.0.5", False), ("fe80::1", False), ("", False), ("testclient", False)],
)  # fmt: skip
def test_local_addresses(host: str, local: bool) -> None:
    assert is_local(host) is local


def test_without_login_only_the_local_machine(make_config: MakeConfig) -> None:
    access = Access(make_config())
    assert access.check(request("127.0.0.1")) == Editor("local")
    with pytest.raises(WorkshopError) as refused:
        access.check(request("10.0.0.5"))
    assert refused.value.code == "workshop.remote" and refused.value.params == {"host": "10.0.0.5"}
    assert "workshop.allow_remote" in refused.value.localized("zh-CN")[1]


def test_without_login_the_address_asked_for_must_be_local_too(make_config: MakeConfig) -> None:
    access = Access(make_config())
    for asked in ("localhost:8501", "[::1]:8501", "127.0.0.1"):
        assert access.check(request("127.0.0.1", asked=asked)) == Editor("local")
    with pytest.raises(WorkshopError) as rebound:  # a name pointed at 127.0.0.1 by someone else (DNS rebinding)
        access.check(request("127.0.0.1", asked="evil.example:8501", origin="http://evil.example:8501"))
    assert rebound.value.code == "workshop.remote"
    assert host_name("[::1]:8501") == "::1" and host_name("localhost") == "localhost" and host_name(None) == ""


def test_allow_remote_lets_others_in_and_names_them(make_config: MakeConfig) -> None:
    access = Access(make_config(workshop__allow_remote="true"))
    assert access.check(request("10.0.0.5", asked="chat.example:8501")) == Editor("from 10.0.0.5")


def test_with_login_the_role_decides(make_config: MakeConfig, tmp_path: Path) -> None:
    users = tmp_path / "users.yaml"
    digest = hash_password("password-123")
    write_users_file(users, {"ed": digest, "ann": digest, "uma": digest}, {"ed": "editor", "ann": "admin"})
    cfg = make_config(auth__enabled="true", auth__users_file=str(users), workshop__allow_remote="false")
    logged_in: dict[str, str | None] = {"who": None}
    access = Access(cfg, Accounts.from_config(cfg), identify=lambda _: logged_in["who"])

    def verdict(name: str | None, host: str = "10.0.0.5") -> Editor | str | None:
        logged_in["who"] = name
        try:
            return access.check(request(host))
        except WorkshopError as exc:
            return exc.code

    # With login on, the role decides wherever the request comes from; the local machine gets no favour.
    assert verdict("ed") == Editor("ed", "editor")
    assert verdict("ann") == Editor("ann", "admin")
    assert verdict("uma") == "workshop.not_editor"
    assert verdict("uma", host="127.0.0.1") == "workshop.not_editor"
    assert verdict(None, host="127.0.0.1") == "workshop.login_needed"
    assert verdict("gone") == "workshop.not_editor"  # a token for a user since removed from the file
    with pytest.raises(WorkshopError) as refused:
        logged_in["who"] = "uma"
        access.check(request("127.0.0.1"))
    assert "add-user uma --role editor" in refused.value.localized("zh-CN")[1]
