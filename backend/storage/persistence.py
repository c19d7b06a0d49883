"""The app's saved-conversation state: which database, opened and migrated at startup, and what to tell users.

A database that cannot be opened (damaged, locked, unreachable) is logged and told once in each chat, and
the chat goes on without history; failures while running are told once per chat as well."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from backend.config import AppConfig
from backend.storage.database import HistoryStore, StorageError, redact, storage_error

log = logging.getLogger(__name__)

DB_FILE = "chat.db"


# A URL without a driver (the DATABASE_URL of most hosting services: postgres://...) gets the one this app installs.
DRIVERS = {"postgres": "postgresql+asyncpg", "postgresql": "postgresql+asyncpg", "sqlite": "sqlite+aiosqlite"}


def database_url(cfg: AppConfig) -> str:
    """The configured database URL (with the app's async driver where it names none), or the data folder's SQLite."""
    configured = cfg.storage.database_url.get_secret_value().strip() if cfg.storage.database_url else ""
    if not configured:
        return f"sqlite+aiosqlite:///{cfg.paths.data / DB_FILE}"
    scheme, sep, rest = configured.partition("://")
    return f"{DRIVERS[scheme]}://{rest}" if sep and scheme in DRIVERS else configured


def app_database_url(cfg: AppConfig) -> str:
    """The URL of the app's one database (database_url), its SQLite file made first where there is none yet: what
    every part that keeps something there opens (conversations, keys and quotas, documents, the workshop's history)."""
    url = database_url(cfg)
    _create_sqlite_file(url)
    return url


def _create_sqlite_file(url: str) -> None:
    """Create a new SQLite file readable by its owner only (SQLite gives its -wal file the same mode)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return
    path = Path(parsed.database)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))  # an empty file is an empty database


@dataclass
class NoticeMark:
    """What one chat session has been told about storage problems."""

    failures: int
    told: str = ""


class Persistence:
    """The app's saved-conversation state: the data layer when it works, or why there is none."""

    def __init__(self) -> None:
        self.store: HistoryStore | None = None
        self.problem: StorageError | None = None

    async def open(self, cfg: AppConfig, login: bool) -> HistoryStore | None:
        """Open and migrate the database when conversations are kept; on failure keep the error and go on."""
        if not (login and cfg.storage.enabled):
            log.info("Conversations are not saved (%s).", "storage disabled" if login else "login is off")
            return None
        url = database_url(cfg)
        try:
            _create_sqlite_file(url)
            store = HistoryStore(url)
        except OSError as exc:
            self.problem = storage_error(exc, redact(url), "creating")
            log.error("%s", self.problem)
            return None
        except (ArgumentError, ImportError, ValueError) as exc:
            self.problem = StorageError.of("storage.bad_url", url=redact(url), detail=str(exc))
            log.error("%s", self.problem)
            return None
        try:
            version = await store.prepare()
        except StorageError as exc:
            self.problem = exc
            log.error("%s Conversations are not saved until this is fixed.", exc)
            await store.close()
            return None
        log.info("Conversations are saved in %s (schema version %d).", store.where, version)
        self.store = store
        return store

    def layer(self) -> HistoryStore | None:
        """The data layer for Chainlit (None: no history)."""
        return self.store

    async def keep_session(self, thread_id: str | None, metadata: dict) -> None:
        """Save a saved thread's session metadata (its settings) now. Chainlit saves it only when the browser
        disconnects, so an app stopped or restarted while the tab is open lost the settings changed meanwhile."""
        if self.store is not None and thread_id:
            await self.store.update_thread(thread_id=thread_id, metadata=metadata)

    def mark(self) -> NoticeMark:
        """A new session's mark: it hears of a failed start at once, of later failures when they happen."""
        return NoticeMark(failures=self.store.failures if self.store is not None else -1)

    def news(self, mark: NoticeMark) -> StorageError | None:
        """The problem to tell the session now (once per distinct problem), or None; updates `mark`."""
        failures = self.store.failures if self.store is not None else 0
        problem = self.store.problem if self.store is not None else self.problem
        fresh = problem is not None and failures > mark.failures
        mark.failures = failures
        if problem is None or not fresh or str(problem) == mark.told:
            return None
        mark.told = str(problem)
        return problem
