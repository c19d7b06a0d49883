"""`python -m backend api-key ...`: an administrator's key management and usage from the command line (the same
database as the app's): create a key for a user (printed once), list keys, revoke one, show usage."""

from __future__ import annotations

import asyncio
import sys

from backend.accounts.login import Accounts
from backend.accounts.users import name_problem
from backend.api.keys import KeyStore
from backend.api.sso_accounts import SsoAccounts
from backend.config import AppConfig
from backend.errors import ServiceError
from backend.storage.quotas import Quotas
from backend.storage.shared import SharedDatabase


async def _run(cfg: AppConfig, action: str, user: str | None, name: str | None, key_id: str | None) -> int:
    db = SharedDatabase.from_config(cfg)
    try:
        await db.prepare()
        keys = KeyStore(db)
        if action == "create":
            assert user is not None
            accounts = Accounts.from_config(cfg)
            accounts.know_sso(await SsoAccounts(db).roles())  # the organisation's sign-in accounts too
            if accounts.role(user) is None:
                print(f"api-key: there is no user {user!r}: add them first with `python -m backend add-user {user}`.",
                      file=sys.stderr)  # fmt: skip
                return 2
            key, info = await keys.create(user, name or "cli")
            print(f"Key {info.id} ({info.name}) for {user}; shown only this once:\n{key}")
        elif action == "list":
            for info in await keys.list(user, revoked=True):
                state = f"revoked {info.revoked_at}" if info.revoked_at else f"last used {info.last_used_at or '-'}"
                print(f"{info.id}  {info.user:<16} {info.prefix}…  {info.name!r}  created {info.created_at}, {state}")
        elif action == "revoke":
            assert key_id is not None
            info = await keys.revoke(key_id)
            print(f"Revoked key {info.id} ({info.name}) of {info.user}.")
        else:
            rows = await Quotas(db, cfg.api).usage(user)
            print(f"{'user':<16} {'day':<10} {'route':<5} {'requests':>9} {'prompt':>10} {'reply':>10}")
            for row in rows:
                print(f"{row.user:<16} {row.day:<10} {row.route:<5} {row.requests:>9} {row.prompt_tokens:>10} "
                      f"{row.reply_tokens:>10}")  # fmt: skip
        return 0
    except ServiceError as exc:
        print(f"api-key: {exc}", file=sys.stderr)
        return 1
    finally:
        await db.close()


def api_key_command(
    cfg: AppConfig, action: str, user: str | None = None, name: str | None = None, key_id: str | None = None
) -> int:
    """`api-key create USER [--name N] | list [USER] | revoke ID | usage [USER]`."""
    return asyncio.run(_run(cfg, action, user, name, key_id))


async def _link(cfg: AppConfig, name: str, email: str) -> int:
    if (problem := name_problem(name)) or "@" not in email:
        print(f"link-account: {problem or f'{email!r} is not an email address'}", file=sys.stderr)
        return 2
    if name not in Accounts.from_config(cfg).password_names():
        print(f"link-account: there is no password account {name!r} in the users file.", file=sys.stderr)
        return 2
    db = SharedDatabase.from_config(cfg)
    try:
        await db.prepare()
        await SsoAccounts(db).link(name, email)
    except ServiceError as exc:
        print(f"link-account: {exc}", file=sys.stderr)
        return 1
    finally:
        await db.close()
    print(f"The next sign-in through the organisation's provider with the verified email {email} uses the account "
          f"{name} (its history, keys and role from the users file).")  # fmt: skip
    return 0


def link_account_command(cfg: AppConfig, name: str, email: str) -> int:
    """`link-account NAME --email E`: let the organisation's sign-in with the verified email E use the existing
    password account NAME (never done without an admin: docs/accounts.md)."""
    return asyncio.run(_link(cfg, name, email))
