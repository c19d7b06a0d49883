"""The organisation's users' accounts (backend.api.sso_accounts) on SQLite and PostgreSQL: made at the first sign-in,
the name kept, the role set again at every sign-in, no name taken from another account without an admin's link, one
account when two processes sign the same new user in at once, and the roles every process reads back."""

from __future__ import annotations

import asyncio

import pytest

from backend.accounts.login import Accounts
from backend.accounts.oidc import Identity
from backend.api.sso_accounts import SsoAccounts
from backend.errors import SignInError
from backend.storage.shared import SharedDatabase

ISSUER = "https://sso.example.org"


def who(subject: str, name: str, email: str | None = None, verified: bool = True) -> Identity:
    return Identity(ISSUER, subject, name, email, verified, ("chat-users",))


async def test_the_first_sign_in_makes_the_account_and_later_ones_keep_its_name_and_set_its_role(
    db: SharedDatabase,
) -> None:
    store = SsoAccounts(db)
    first = await store.sign_in(who("1", "alice"), "editor", set())
    assert (first.name, first.role, first.linked) == ("alice", "editor", False)
    renamed = await store.sign_in(who("1", "alice.liddell"), "user", set())  # renamed at the provider
    assert (renamed.name, renamed.role) == ("alice", "user"), "the account keeps the name it was made with"
    await store.sign_in(who("1", "alice"), None, set())  # in no allowed group any more
    assert await store.roles() == {"alice": None}


async def test_a_name_another_account_holds_is_refused(db: SharedDatabase) -> None:
    store = SsoAccounts(db)
    await store.sign_in(who("1", "alice"), "user", set())
    with pytest.raises(SignInError) as caught:
        await store.sign_in(who("2", "alice"), "admin", set())  # another person at the provider, same name
    assert caught.value.code == "sso.name_taken"
    with pytest.raises(SignInError):
        await store.sign_in(who("3", "carol", "carol@example.org"), "user", {"carol"})  # a password account's
    assert await store.roles() == {"alice": "user"}


async def test_an_admins_link_lets_a_verified_email_into_the_password_account_once(db: SharedDatabase) -> None:
    store = SsoAccounts(db)
    await store.link("carol", "Carol@Example.org")
    with pytest.raises(SignInError):  # an email the provider did not verify does not use the link
        await store.sign_in(who("9", "carol", "carol@example.org", verified=False), "user", {"carol"})
    account = await store.sign_in(who("3", "carol.c", "carol@example.org"), "user", {"carol"})
    assert (account.name, account.linked) == ("carol", True)
    with pytest.raises(SignInError):  # the link was used: a second provider user with that email gets nothing
        await store.sign_in(who("4", "carol", "carol@example.org"), "user", {"carol"})
    again = await store.sign_in(who("3", "carol.c", "carol@example.org"), "admin", {"carol"})
    assert (again.name, again.linked) == ("carol", True)


async def test_one_new_user_signed_in_by_two_processes_at_once_gets_one_account(db: SharedDatabase) -> None:
    stores = [SsoAccounts(db), SsoAccounts(SharedDatabase(db.url))]
    try:
        accounts = await asyncio.gather(*(s.sign_in(who("7", "dora"), "user", set()) for s in stores * 4))
    finally:
        await stores[1].db.close()
    assert {a.name for a in accounts} == {"dora"}
    assert await stores[0].roles() == {"dora": "user"}


async def test_the_roles_read_back_are_what_accounts_answer(db: SharedDatabase, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = SsoAccounts(db)
    await store.sign_in(who("1", "alice"), "editor", set())
    await store.sign_in(who("2", "bob"), None, set())
    accounts = Accounts(tmp_path / "users.yaml")
    assert accounts.role("alice") is None, "not known before it is read"
    accounts.know_sso(await store.roles(), replace=True)
    assert (accounts.role("alice"), accounts.role("bob"), accounts.role("nobody")) == ("editor", None, None)


async def test_a_process_that_has_not_heard_of_a_new_account_reads_it_at_once(db: SharedDatabase, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from backend.config import AppConfig
    from backend.web.sign_in import SignIn

    cfg = AppConfig(auth={"enabled": True, "proxy": {"enabled": True}})
    other_process = SignIn(cfg, Accounts(tmp_path / "users.yaml"), db)  # its roles read before the sign-in
    await SsoAccounts(db).sign_in(who("1", "erin"), "editor", set())  # signed in on this one
    assert other_process.accounts.role("erin") is None, "not refreshed yet"
    assert await other_process.role_now("erin") == "editor", "an unknown name is looked up, not refused"
    assert await other_process.role_now("nobody") is None
