"""Where the workshop keeps its version history and takes its lock: one place that every app process sees.

One app process (no storage.database_url): the data folder's files (backend.workshop.versions.VersionStore) and a
lock of the process, as before. Several processes on one database (storage.database_url set): the table
``workshop_versions`` (schema version 3) and a lock in the database itself, held for the whole check, compare,
write and record of a change: PostgreSQL's advisory transaction lock, or SQLite's write lock (BEGIN IMMEDIATE). Two
editors on two processes then get the same conflict message as two editors on one.
"""

from __future__ import annotations

import asyncio
import contextvars
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import text as sql
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from backend.config import AppConfig
from backend.errors import WorkshopError
from backend.storage.database import open_engine, redact
from backend.storage.persistence import app_database_url
from backend.storage.schema import migrate
from backend.workshop.versions import OUTSIDE, Action, Version, VersionStore, now_utc, outside_change, version_tag

WORKSHOP_LOCK_KEY = 4_510_205  # the advisory lock of template changes (schema.ADVISORY_LOCK_KEY + 2)
COLUMNS = '"number", "tag", "who", "at", "note", "action"'


class History(ABC):
    """The versions of the template files, and the lock a change holds from its check to its record."""

    where: str  # for messages: the folder or the database (without its password)

    @abstractmethod
    async def versions(self, stem: str) -> list[Version]:
        """The versions of `stem`, oldest first ([] when the workshop never saw it)."""

    @abstractmethod
    async def text(self, stem: str, number: int) -> str | None:
        """The text of version `number` of `stem` (None: unknown, or a deletion)."""

    @abstractmethod
    async def record(self, stem: str, text: str | None, who: str, note: str, action: Action) -> Version:
        """Add a version (text None: the file was deleted)."""

    @abstractmethod
    def exclusive(self) -> Any:
        """An async context manager: one change at a time among all processes that share this history."""

    async def latest(self, stem: str) -> Version | None:
        found = await self.versions(stem)
        return found[-1] if found else None

    async def note_outside_change(self, stem: str, text: str | None) -> Version | None:
        """Record the file as it is now when it differs from the last recorded version (see outside_change)."""
        found = outside_change(await self.latest(stem), text)
        return None if found is None else await self.record(stem, text, OUTSIDE, *found)

    async def close(self) -> None:  # noqa: B027 (only the database's history holds something open)
        """Let go of what the history holds open."""


class FolderHistory(History):
    """The data folder's history files (one app process): its lock is the process's own."""

    def __init__(self, store: VersionStore) -> None:
        self.store = store
        self.where = str(store.root)
        self._lock = asyncio.Lock()

    async def versions(self, stem: str) -> list[Version]:
        return self.store.history(stem)

    async def text(self, stem: str, number: int) -> str | None:
        return self.store.text(stem, number)

    async def record(self, stem: str, text: str | None, who: str, note: str, action: Action) -> Version:
        return self.store.record(stem, text, who, note, action)

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._lock:
            yield


class DatabaseHistory(History):
    """The table workshop_versions of the app's database, shared by every app process on it."""

    def __init__(self, url: str) -> None:
        self.where = redact(url)
        # A change reads, then writes: on SQLite its transaction takes the write lock first (and waits for it).
        self.engine: AsyncEngine = open_engine(url, immediate=True)
        self._migrated = False
        self._held: contextvars.ContextVar[AsyncConnection | None] = contextvars.ContextVar("held", default=None)

    def _failed(self, exc: BaseException) -> WorkshopError:
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0] if str(exc) else type(exc).__name__
        return WorkshopError.of("workshop.history_failed", where=self.where, reason=reason.rstrip("."))

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[AsyncConnection]:
        """The connection of the change under way in this task, else a transaction of its own."""
        held = self._held.get()
        if held is not None:
            yield held
            return
        try:
            async with self.engine.begin() as conn:
                if not self._migrated:
                    await migrate(conn, self.where)  # the app's start migrated it already; a test's did not
                    self._migrated = True
                yield conn
        except (SQLAlchemyError, OSError) as exc:
            raise self._failed(exc) from exc

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._connection() as conn:
            if conn.dialect.name == "postgresql":  # SQLite: BEGIN IMMEDIATE took the database's write lock
                await conn.execute(sql("SELECT pg_advisory_xact_lock(:key)"), {"key": WORKSHOP_LOCK_KEY})
            token = self._held.set(conn)
            try:
                yield
            finally:
                self._held.reset(token)

    async def _rows(self, query: str, **params: object) -> list[Any]:
        try:
            async with self._connection() as conn:
                result = await conn.execute(sql(query), params)
                return list(result.fetchall()) if result.returns_rows else []
        except SQLAlchemyError as exc:
            raise self._failed(exc) from exc

    async def versions(self, stem: str) -> list[Version]:
        rows = await self._rows(
            f'SELECT {COLUMNS} FROM workshop_versions WHERE "stem" = :stem ORDER BY "number"', stem=stem
        )
        return [Version(int(r[0]), r[1], r[2], r[3], r[4], r[5]) for r in rows]

    async def text(self, stem: str, number: int) -> str | None:
        rows = await self._rows(
            'SELECT "body" FROM workshop_versions WHERE "stem" = :stem AND "number" = :number', stem=stem, number=number
        )
        return rows[0][0] if rows else None

    async def record(self, stem: str, text: str | None, who: str, note: str, action: Action) -> Version:
        async with self.exclusive():  # the change's own lock when it holds one (a nested use joins it)
            rows = await self._rows('SELECT MAX("number") FROM workshop_versions WHERE "stem" = :stem', stem=stem)
            version = Version(int(rows[0][0] or 0) + 1, version_tag(text), who, now_utc(), note, action)
            await self._rows(
                f'INSERT INTO workshop_versions ("stem", {COLUMNS}, "body") '
                "VALUES (:stem, :number, :tag, :who, :at, :note, :action, :body)",
                stem=stem, number=version.number, tag=version.tag, who=who, at=version.when, note=note,
                action=action, body=text,
            )  # fmt: skip
        return version

    async def close(self) -> None:
        await self.engine.dispose()


def open_history(cfg: AppConfig) -> History:
    """The database's history where storage.database_url names one (several app processes may share it), else the
    data folder's (one process)."""
    configured = cfg.storage.database_url.get_secret_value().strip() if cfg.storage.database_url else ""
    if not configured:
        return FolderHistory(VersionStore(cfg.paths.data / "workshop"))
    return DatabaseHistory(app_database_url(cfg))
