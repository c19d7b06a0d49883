"""The accounts of the organisation's sign-in (OpenID Connect or a sign-in proxy) in the app's database.

A provider's user (issuer, subject) gets an app user name at their first sign-in, the name its claims give, and
keeps it. That name must be free: a password account of the same name (the users file) or another provider user
holding it refuses the sign-in, never merges silently, unless an admin linked that password account to the user's
verified email (`link-account NAME --email E`). The role is set again at every sign-in from the user's groups; a
user in no allowed group keeps the account (its history) with no role, so their sessions and API keys stop working.
Every app process reads the roles back from the database (`roles()`), so a sign-in on one counts on all."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from backend.accounts.oidc import Identity
from backend.errors import SignInError, StorageError
from backend.storage.shared import SharedDatabase

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Account:
    name: str
    role: str | None
    linked: bool  # signed in to a password account an admin linked


class SsoAccounts:
    """Sign-ins of the organisation's users, their names and roles, and the admins' links."""

    def __init__(self, db: SharedDatabase, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.clock = clock

    async def sign_in(self, who: Identity, role: str | None, password_names: Collection[str]) -> Account:
        """Record the sign-in of `who` with `role` (None: in no allowed group) and return their account, or raise
        SignInError (sso.name_taken) when its name belongs to someone else. `password_names`: the users file's."""
        for attempt in range(2):  # a second process making the same new account at once: read theirs
            try:
                return await self._sign_in(who, role, password_names)
            except StorageError as exc:
                if attempt or not isinstance(exc.__cause__, IntegrityError):
                    raise
        raise AssertionError("unreachable")

    async def _sign_in(self, who: Identity, role: str | None, password_names: Collection[str]) -> Account:
        key = {"iss": who.issuer, "sub": who.subject}
        now, groups = self.clock(), json.dumps(list(who.groups), ensure_ascii=False)
        async with self.db.transaction(f"sso:{who.issuer}:{who.subject}") as conn:
            row = (
                await conn.execute(
                    text('SELECT "name" FROM sso_accounts WHERE "issuer" = :iss AND "subject" = :sub'), key
                )
            ).first()
            if row is not None:
                name = str(row[0])
                await conn.execute(
                    text(
                        'UPDATE sso_accounts SET "email" = :email, "role" = :role, "groups" = :groups, '
                        '"signed_in_at" = :now WHERE "issuer" = :iss AND "subject" = :sub'
                    ),
                    {**key, "email": who.email, "role": role, "groups": groups, "now": now},
                )
                return Account(name, role, name in password_names)
            linked = None
            if who.email and who.email_verified:
                found = await conn.execute(
                    text('SELECT "name" FROM sso_links WHERE "email" = :email'), {"email": who.email.lower()}
                )
                linked = found.scalar()
            name = str(linked) if linked is not None else who.name
            taken = await conn.execute(text('SELECT 1 FROM sso_accounts WHERE "name" = :name'), {"name": name})
            if taken.first() is not None or (linked is None and name in password_names):
                log.warning(
                    "Sign-in of %s (%s) refused: the name %r is another account's", who.subject, who.issuer, name
                )
                raise SignInError.of("sso.name_taken", name=name)
            await conn.execute(
                text(
                    'INSERT INTO sso_accounts ("issuer", "subject", "name", "email", "role", "groups", "signed_in_at") '
                    "VALUES (:iss, :sub, :name, :email, :role, :groups, :now)"
                ),
                {**key, "name": name, "email": who.email, "role": role, "groups": groups, "now": now},
            )
            if linked is not None:
                await conn.execute(
                    text('DELETE FROM sso_links WHERE "email" = :email'), {"email": (who.email or "").lower()}
                )
                log.info("%s signed in to the password account %r an admin linked to their email", who.subject, name)
            else:
                log.info("New account %r from %s", name, who.issuer)
            return Account(name, role, linked is not None)

    async def roles(self) -> dict[str, str | None]:
        """Every account's name and role (None: in no allowed group at its last sign-in)."""
        async with self.db.transaction() as conn:
            rows = await conn.execute(text('SELECT "name", "role" FROM sso_accounts'))
            return {str(name): (str(role) if role is not None else None) for name, role in rows}

    async def link(self, name: str, email: str) -> None:
        """Let the next sign-in with the verified `email` use the existing account `name` (an admin's decision)."""
        async with self.db.transaction() as conn:
            await conn.execute(text('DELETE FROM sso_links WHERE "email" = :email'), {"email": email.lower()})
            await conn.execute(
                text('INSERT INTO sso_links ("email", "name", "linked_at") VALUES (:email, :name, :now)'),
                {"email": email.lower(), "name": name, "now": self.clock()},
            )
