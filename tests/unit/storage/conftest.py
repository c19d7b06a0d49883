"""What the tests of the shared database share (the quotas here, the API's keys, logins and accounts in tests/unit/api):
the app's database (SQLite and PostgreSQL, migrated) and a clock they move."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest_asyncio

from backend.storage.shared import SharedDatabase

NOON = datetime(2026, 1, 1, 12, tzinfo=UTC).timestamp()


class Clock:
    """A clock a test moves by hand (`clock.now += 61`)."""

    def __init__(self) -> None:
        self.now = NOON

    def __call__(self) -> float:
        return self.now


@pytest_asyncio.fixture
async def db(db_url: str) -> AsyncIterator[SharedDatabase]:
    database = SharedDatabase(db_url)
    await database.prepare()
    yield database
    await database.close()
