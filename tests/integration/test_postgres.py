"""The same schema and data layer on a real PostgreSQL server (the option for several app instances).

Runs only when ERNIE_TEST_POSTGRES_URL names an empty database, e.g.
postgresql+asyncpg://postgres@127.0.0.1:55432/chat (and asyncpg is importable); docs/accounts.md says how."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from chainlit.context import init_http_context
from chainlit.types import Pagination, ThreadFilter
from chainlit.user import User
from sqlalchemy import text

from backend.storage.database import HistoryStore
from backend.storage.resume import history_from_thread, turn_metadata
from backend.storage.schema import LATEST, TABLES, VERSION_TABLE, missing_columns
from tests.unit.storage.test_database import save_turn

URL = os.environ.get("ERNIE_TEST_POSTGRES_URL", "")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not URL, reason="set ERNIE_TEST_POSTGRES_URL to test PostgreSQL (docs/accounts.md)"),
]


@pytest_asyncio.fixture
async def store() -> AsyncIterator[HistoryStore]:
    pytest.importorskip("asyncpg")
    init_http_context()
    cleaner = HistoryStore(URL)
    async with cleaner.engine.begin() as conn:  # start from an empty database
        for table in [*reversed(TABLES), VERSION_TABLE]:
            await conn.execute(text(f"DROP TABLE IF EXISTS {table} CASCADE"))
    await cleaner.close()
    db = HistoryStore(URL)
    yield db
    await db.close()


async def test_instances_starting_together_migrate_once(store: HistoryStore) -> None:
    others = [HistoryStore(URL) for _ in range(3)]
    versions = await asyncio.gather(store.prepare(), *(o.prepare() for o in others))
    for other in others:
        await other.close()
    assert versions == [LATEST] * 4
    async with store.engine.connect() as conn:
        assert await missing_columns(conn) == []
        rows = (await conn.execute(text(f"SELECT version FROM {VERSION_TABLE}"))).scalars().all()
    assert rows == [LATEST]


async def test_data_layer_round_trip(store: HistoryStore) -> None:
    await store.prepare()
    alice = await store.create_user(User(identifier="alice"))
    bob = await store.create_user(User(identifier="bob"))
    assert alice and bob
    thread = str(uuid.uuid4())
    await save_turn(store, thread, alice.id, "What is 2+2?", "4")
    assert store.failures == 0, store.problem

    page = await store.list_threads(Pagination(first=20), ThreadFilter(userId=alice.id))
    assert [t["id"] for t in page.data] == [thread]
    assert (await store.list_threads(Pagination(first=20), ThreadFilter(userId=bob.id))).data == []
    assert await store.get_thread_author(thread) == "alice"
    assert await store.get_thread_author(str(uuid.uuid4())) == ""
    assert await store.get_thread_author("not-a-uuid") == "" and await store.get_thread("not-a-uuid") is None
    saved = await store.get_thread(thread)
    assert saved is not None
    assert history_from_thread(saved) == turn_metadata("What is 2+2?", "4")["ernie_turn"]

    await store.update_thread(thread, name="Arithmetic")
    assert (await store.get_thread(thread) or {}).get("name") == "Arithmetic"
    await store.delete_thread(thread)
    assert await store.get_thread(thread) is None
    assert store.failures == 0, store.problem
