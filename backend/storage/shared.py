"""A connection of its own to the app's database (the one conversations use), migrated like it on start, for what
every app process must see at once: the API's keys, the quotas and usage (backend.storage.quotas, counted for the chat
and the API alike), logins and the organisation's accounts.

Keys, quotas and usage live there, so every app process on one database sees the same counts. On PostgreSQL a
transaction about one user first takes an advisory lock on that user: two processes admit them one at a time."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from backend.config import AppConfig
from backend.errors import StorageError
from backend.storage.database import migrate_database, open_engine, redact, storage_error
from backend.storage.persistence import app_database_url

USER_LOCK_SPACE = 4_510_204  # the first key of the per-user advisory locks (schema.ADVISORY_LOCK_KEY + 1)


def user_lock_key(user: str) -> int:
    """A stable 31-bit number for a user name (the second key of their advisory lock)."""
    return int.from_bytes(hashlib.sha256(user.encode()).digest()[:4], "big") & 0x7FFFFFFF


class SharedDatabase:
    """An async engine on the app's database, with one transaction per call."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.where = redact(url)
        # Keys and quotas read, then write: on SQLite each transaction takes the write lock first (and waits for it).
        self.engine: AsyncEngine = open_engine(url, immediate=True)
        self.dialect = self.engine.dialect.name
        self.closed = False

    @classmethod
    def from_config(cls, cfg: AppConfig) -> SharedDatabase:
        return cls(app_database_url(cfg))

    async def prepare(self) -> int:
        """Bring the schema up to date (the API's keys and the quotas are schema version 2); raise StorageError."""
        return await migrate_database(self.engine, self.where)

    @asynccontextmanager
    async def transaction(self, user: str | None = None) -> AsyncIterator[AsyncConnection]:
        """One transaction (committed unless the block raises); `user`: serialized with others about that user."""
        try:
            async with self.engine.begin() as conn:
                if user is not None and self.dialect == "postgresql":
                    await conn.execute(
                        text("SELECT pg_advisory_xact_lock(:space, :key)"),
                        {"space": USER_LOCK_SPACE, "key": user_lock_key(user)},
                    )
                yield conn
        except (SQLAlchemyError, OSError) as exc:
            raise storage_error(exc, self.where, "saving") from exc

    async def close(self) -> None:
        self.closed = True  # what still runs in the background (a quota refresh) leaves it closed
        await self.engine.dispose()


__all__ = ["SharedDatabase", "StorageError"]
