"""A schema migration from one release to the next, on SQLite and on PostgreSQL: a database written by the previous
release (schema version 1, with a user's conversation and feedback in it) is upgraded when the next release starts,
and nothing in it is lost; a migration that fails leaves the database as it was (docs/accounts.md, "Migrations").

The upgrade from release 1 runs the app's real migrations (2: the API's keys, quotas and usage; 3: the workshop's
version history) and one more made up here: it adds a column with a default to a table that holds rows, and an
index, which is what a real one does."""

from __future__ import annotations

import uuid

import pytest
from chainlit.context import init_http_context
from chainlit.types import Feedback
from chainlit.user import User
from sqlalchemy import text

from backend.chat.saved import history_from_thread, turn_metadata
from backend.errors import StorageError
from backend.storage import schema
from backend.storage.database import HistoryStore
from backend.storage.persistence import Persistence
from backend.storage.schema import VERSION_TABLE, Migration
from tests.conftest import MakeConfig
from tests.unit.storage.test_database import columns, query, save_turn

NEXT = Migration(
    schema.LATEST + 1,
    "threads: an archived flag",
    {
        "sqlite": [
            'ALTER TABLE threads ADD COLUMN "archived" INTEGER NOT NULL DEFAULT 0',
            'CREATE INDEX IF NOT EXISTS threads_archived ON threads ("userId", "archived")',
        ],
        "postgresql": [
            'ALTER TABLE threads ADD COLUMN "archived" BOOLEAN NOT NULL DEFAULT FALSE',
            'CREATE INDEX IF NOT EXISTS threads_archived ON threads ("userId", "archived")',
        ],
    },
)


async def a_release_1_database(url: str) -> tuple[str, str]:
    """A database as release 1 leaves it: schema version 1, alice's conversation with a rated reply.
    Returns (thread id, the rated reply's id)."""
    init_http_context()
    old = HistoryStore(url)
    with pytest.MonkeyPatch.context() as release_1:
        release_1.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:1])
        release_1.setattr(schema, "LATEST", 1)
        assert await old.prepare() == 1
    alice = await old.create_user(User(identifier="alice"))
    assert alice is not None
    thread = str(uuid.uuid4())
    await save_turn(old, thread, alice.id, "What is 2+2?", "4")
    saved = await old.get_thread(thread)
    assert saved is not None
    reply = next(s["id"] for s in saved["steps"] if s["type"] == "assistant_message")
    await old.upsert_feedback(Feedback(forId=reply, value=1, threadId=thread, comment="right"))
    assert old.failures == 0, old.problem
    await old.close()
    return thread, reply


async def test_the_next_release_upgrades_the_schema_on_start_and_keeps_the_data(
    db_url: str, make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread, reply = await a_release_1_database(db_url)

    monkeypatch.setattr(schema, "MIGRATIONS", [*schema.MIGRATIONS, NEXT])
    monkeypatch.setattr(schema, "LATEST", NEXT.version)
    persistence = Persistence()  # the app's start (app.py's on_app_startup opens it the same way)
    store = await persistence.open(make_config(storage__database_url=db_url), login=True)
    assert store is not None, persistence.problem

    applied = await query(db_url, f"SELECT version FROM {VERSION_TABLE} ORDER BY version")
    assert applied == list(range(1, NEXT.version + 1))
    assert "archived" in await columns(db_url, "threads")
    assert await query(db_url, "SELECT COUNT(*) FROM api_keys") == [0], "release 2's tables are there"
    assert await query(db_url, "SELECT COUNT(*) FROM workshop_versions") == [0], "and release 3's"
    assert await query(db_url, 'SELECT "archived" FROM threads') in ([0], [False]), "old rows get the default"
    kept = await store.get_thread(thread)
    assert kept is not None and kept["name"] == "What is 2+2?" and kept["userIdentifier"] == "alice"
    assert history_from_thread(kept) == turn_metadata("What is 2+2?", "4")["ernie_turn"], "resume still works"
    rated = next(s for s in kept["steps"] if s["id"] == reply)
    feedback = rated.get("feedback")
    assert feedback is not None and feedback["value"] == 1 and feedback["comment"] == "right"
    await store.close()

    again = Persistence()  # the next start finds nothing to do
    store = await again.open(make_config(storage__database_url=db_url), login=True)
    assert store is not None
    await store.close()
    assert await query(db_url, f"SELECT version FROM {VERSION_TABLE} ORDER BY version") == applied


async def test_a_failed_migration_leaves_the_previous_release_s_database_as_it_was(
    db_url: str, make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread, _ = await a_release_1_database(db_url)
    broken = Migration(
        NEXT.version, "broken", {d: [*NEXT.statements[d], "ALTER TABLE no_such_table ADD x INT"] for d in schema.TYPES}
    )
    monkeypatch.setattr(schema, "MIGRATIONS", [*schema.MIGRATIONS, broken])
    monkeypatch.setattr(schema, "LATEST", broken.version)

    persistence = Persistence()
    assert await persistence.open(make_config(storage__database_url=db_url), login=True) is None
    assert isinstance(persistence.problem, StorageError) and "no_such_table" in str(persistence.problem)
    assert await query(db_url, f"SELECT version FROM {VERSION_TABLE}") == [1]
    assert "archived" not in await columns(db_url, "threads"), "the migration's first statement was rolled back too"
    assert await query(db_url, "SELECT id FROM threads") in ([thread], [uuid.UUID(thread)])

    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:1])  # the previous release still opens it
    monkeypatch.setattr(schema, "LATEST", 1)
    store = HistoryStore(db_url)
    assert await store.prepare() == 1
    async with store.engine.connect() as conn:
        assert (await conn.execute(text("SELECT COUNT(*) FROM steps"))).scalar() == 2
    await store.close()
