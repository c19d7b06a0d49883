"""The conversation database, on a real SQLite file and on a real PostgreSQL server (tests/postgres_server.py):
schema and migrations, Chainlit's data layer calls; and a damaged or locked SQLite file (the chat goes on without
history, with one clear message)."""

from __future__ import annotations

import asyncio
import sqlite3
import stat
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from chainlit.context import init_http_context
from chainlit.types import Feedback, Pagination, ThreadFilter
from chainlit.user import User
from sqlalchemy import inspect, text
from sqlalchemy.engine import make_url

from backend.chat.saved import CHAINLIT_STOP_NOTICE, SYSTEM_AUTHOR, history_from_thread, turn_metadata
from backend.storage.database import HistoryStore, StorageError, redact
from backend.storage.persistence import Persistence, database_url
from backend.storage.schema import LATEST, TABLES, VERSION_TABLE, create_tables
from tests.conftest import MakeConfig
from tests.postgres_server import PostgresForTests, free_port


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


@pytest_asyncio.fixture
async def store(db_url: str) -> AsyncIterator[HistoryStore]:
    """A prepared, empty store: once on SQLite, once on PostgreSQL."""
    init_http_context()  # Chainlit's data layer methods look at the current session
    db = HistoryStore(db_url, busy_timeout_s=0.2)
    assert await db.prepare() == LATEST
    yield db
    await db.close()


@pytest_asyncio.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[HistoryStore]:
    """A prepared store on an SQLite file (tmp_path/chat.db), for what only a file can show (locks)."""
    init_http_context()
    db = HistoryStore(sqlite_url(tmp_path / "chat.db"), busy_timeout_s=0.2)
    assert await db.prepare() == LATEST
    yield db
    await db.close()


async def query(url: str, sql: str) -> list[Any]:
    """The first column of each row `sql` returns, through a connection of its own (as another process would)."""
    db = HistoryStore(url)
    try:
        async with db.engine.connect() as conn:
            return list((await conn.execute(text(sql))).scalars().all())
    finally:
        await db.close()


async def columns(url: str, table: str) -> set[str]:
    db = HistoryStore(url)
    try:
        async with db.engine.connect() as conn:
            return await conn.run_sync(lambda c: {col["name"] for col in inspect(c).get_columns(table)})
    finally:
        await db.close()


async def tables(url: str) -> set[str]:
    db = HistoryStore(url)
    try:
        async with db.engine.connect() as conn:
            return await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
    finally:
        await db.close()


def test_ddl_is_generated_for_both_dialects() -> None:
    sqlite, postgres = create_tables("sqlite"), create_tables("postgresql")
    assert len(sqlite) == len(postgres) == len(TABLES) + 4
    assert '"metadata" JSONB' in postgres[0] and '"metadata" TEXT' in sqlite[0]
    assert '"tags" TEXT[]' in postgres[1] and '"id" UUID PRIMARY KEY' in postgres[2]


async def test_schema_is_created_and_recorded_once(store: HistoryStore, db_url: str) -> None:
    for table, cols in TABLES.items():
        assert await columns(db_url, table) == {c.split('"')[1] for c in cols}
    # every key Chainlit writes for a step has a column
    from chainlit.step import StepDict

    assert set(StepDict.__annotations__) - {"feedback"} <= await columns(db_url, "steps")
    # a second start finds the schema done
    again = HistoryStore(db_url)
    assert await again.prepare() == LATEST
    await again.close()
    assert await query(db_url, f"SELECT version FROM {VERSION_TABLE} ORDER BY version") == list(range(1, LATEST + 1))
    if store.dialect == "sqlite":
        assert await query(db_url, "PRAGMA journal_mode") == ["wal"]


async def test_a_database_from_a_newer_app_is_refused(db_url: str) -> None:
    db = HistoryStore(db_url)
    async with db.engine.begin() as conn:
        await conn.execute(text(f"CREATE TABLE {VERSION_TABLE} (version INTEGER NOT NULL, applied_at TEXT NOT NULL)"))
        await conn.execute(text(f"INSERT INTO {VERSION_TABLE} VALUES ({LATEST + 1}, 'later')"))
    with pytest.raises(StorageError, match="newer version of the app") as err:
        await db.prepare()
    await db.close()
    assert err.value.code == "storage.newer_schema" and db.where in str(err.value)
    assert err.value.text("zh-CN").startswith(f"无法使用对话数据库（{db.where}）：它的结构版本为 {LATEST + 1}")
    url = make_url(db_url)
    if db.dialect == "sqlite":
        assert db.where == url.database, "an SQLite database is named by its file"
    else:
        told = str(err.value) + err.value.text("zh-CN")
        assert ":***@" in db.where and str(url.password) not in told, "the password stays out of the message"


async def test_migration_is_one_transaction(db_url: str) -> None:
    db = HistoryStore(db_url)
    async with db.engine.begin() as conn:  # a table in the way with the wrong shape: the migration fails midway
        await conn.execute(text("CREATE TABLE steps (x INTEGER)"))
    with pytest.raises(StorageError):
        await db.prepare()
    await db.close()
    assert await tables(db_url) == {"steps"}, "nothing of the failed migration is left behind"


async def test_instances_starting_together_migrate_once(postgres: PostgresForTests) -> None:
    """Several app instances on one PostgreSQL database (an advisory lock): one migrates, the others find it done."""
    url = postgres.new_database()
    stores = [HistoryStore(url) for _ in range(4)]
    versions = await asyncio.gather(*(s.prepare() for s in stores))
    for each in stores:
        await each.close()
    assert versions == [LATEST] * 4
    assert await query(url, f"SELECT version FROM {VERSION_TABLE} ORDER BY version") == list(range(1, LATEST + 1))


async def save_turn(store: HistoryStore, thread_id: str, user_id: str, question: str, answer: str) -> None:
    await store.update_thread(thread_id, name=question, user_id=user_id)
    ask = {"id": str(uuid.uuid4()), "threadId": thread_id, "type": "user_message", "name": "alice"}
    await store.create_step({**ask, "output": question, "createdAt": "2026-01-01T00:00:01Z", "streaming": False})
    reply = {"id": str(uuid.uuid4()), "threadId": thread_id, "type": "assistant_message", "name": "Assistant"}
    await store.create_step(
        {
            **reply,
            "output": answer + "\n\n*Template: default*",
            "metadata": turn_metadata(question, answer),
            "tags": ["a", "b"],
            "modes": {"mode": "x"},
            "createdAt": "2026-01-01T00:00:02Z",
            "streaming": False,
        }
    )


async def test_chainlit_data_layer_round_trip(store: HistoryStore, db_url: str) -> None:
    alice = await store.create_user(User(identifier="alice"))
    bob = await store.create_user(User(identifier="bob"))
    assert alice and bob and alice.id != bob.id
    thread = str(uuid.uuid4())
    await save_turn(store, thread, alice.id, "What is 2+2?", "4")
    notice = {"id": str(uuid.uuid4()), "threadId": thread, "type": "assistant_message", "name": "system"}
    await store.create_step({**notice, "output": "The model server is ready", "streaming": False})
    assert store.failures == 0, store.problem

    page = await store.list_threads(Pagination(first=20), ThreadFilter(userId=alice.id))
    assert [t["id"] for t in page.data] == [thread]
    assert (await store.list_threads(Pagination(first=20), ThreadFilter(userId=bob.id))).data == []
    assert await store.get_thread_author(thread) == "alice"
    assert await store.get_thread_author(str(uuid.uuid4())) == "", "unknown thread: Chainlit answers 404"

    saved = await store.get_thread(thread)
    assert saved is not None and saved["name"] == "What is 2+2?"
    assert history_from_thread(saved) == turn_metadata("What is 2+2?", "4")["ernie_turn"]
    reply = next(s for s in saved["steps"] if s["type"] == "assistant_message" and s["name"] == "Assistant")

    await store.upsert_feedback(Feedback(forId=reply["id"], value=0, threadId=thread, comment="wrong"))
    await store.update_thread(thread, name="Arithmetic")
    reopened = HistoryStore(db_url)  # as after a restart
    assert await reopened.prepare() == LATEST
    again = await reopened.get_thread(thread)
    assert again is not None and again["name"] == "Arithmetic" and len(again["steps"]) == 3
    rated = next(s for s in again["steps"] if s["id"] == reply["id"])
    feedback = rated.get("feedback")
    assert feedback is not None and feedback["value"] == 0 and feedback["comment"] == "wrong"
    await reopened.close()

    await store.delete_thread(thread)
    assert await store.get_thread(thread) is None
    assert await query(db_url, "SELECT COUNT(*) FROM steps") == [0]
    assert await query(db_url, "SELECT COUNT(*) FROM feedbacks") == [0]
    assert store.failures == 0, store.problem


async def test_a_nul_character_from_the_model_or_the_user_is_left_out_and_the_turn_is_saved(
    store: HistoryStore, db_url: str
) -> None:
    """PostgreSQL refuses NUL in text and JSONB (the whole write failed, the history was lost, every chat was told
    the database was broken); a small model emits it as a byte token. Both databases keep the turn without it."""
    alice = await store.create_user(User(identifier="alice"))
    assert alice
    thread = str(uuid.uuid4())
    await save_turn(store, thread, alice.id, "Why\x00?", "Because\x00 of\x00 this.")
    saved = await store.get_thread(thread)
    assert saved is not None and saved["name"] == "Why?"
    outputs = [s["output"] for s in saved["steps"]]
    assert outputs == ["Why?", "Because of this.\n\n*Template: default*"]
    assert history_from_thread(saved) == turn_metadata("Why?", "Because of this.")["ernie_turn"]
    reply = saved["steps"][1]
    await store.upsert_feedback(Feedback(forId=reply["id"], value=0, threadId=thread, comment="bad\x00"))
    await store.update_thread(thread, name="Renamed\x00", metadata={"note": ["a\x00b"]})
    again = await store.get_thread(thread)
    assert again is not None and again["name"] == "Renamed"
    assert again["steps"][1].get("feedback", {}).get("comment") == "bad"
    assert store.failures == 0 and store.problem is None, store.problem


async def test_a_reply_saved_after_its_thread_was_deleted_neither_brings_it_back_nor_breaks_history(
    store: HistoryStore, db_url: str
) -> None:
    """Chainlit saves a reply's steps in tasks of their own: the page's delete can come first."""
    thread = str(uuid.uuid4())
    await store.update_thread(thread, name="To be deleted")
    await store.delete_thread(thread)
    late = {"id": str(uuid.uuid4()), "threadId": thread, "name": "Assistant", "type": "assistant_message"}
    await store.create_step({**late, "output": "a late reply", "streaming": False, "createdAt": None})
    await store.update_step({**late, "output": "a late reply, updated", "streaming": False, "createdAt": None})
    await store.upsert_feedback(Feedback(forId=late["id"], value=1, threadId=thread))
    assert await query(db_url, "SELECT COUNT(*) FROM threads") == [0], "the thread stays deleted"
    assert await query(db_url, "SELECT COUNT(*) FROM steps") == [0]
    assert store.failures == 0 and store.problem is None


async def test_chainlit_s_english_stop_notice_is_never_saved(sqlite_store: HistoryStore, tmp_path: Path) -> None:
    """The page removes it at once (the stopped reply says it in the user's language): saved, it came back when the
    thread was reopened."""
    thread = str(uuid.uuid4())
    await sqlite_store.update_thread(thread, name="Stopped")
    step = {"threadId": thread, "type": "assistant_message", "streaming": False, "createdAt": None}
    await sqlite_store.create_step({**step, "id": "c", "name": "Assistant", "output": CHAINLIT_STOP_NOTICE})
    await sqlite_store.create_step({**step, "id": "s", "name": SYSTEM_AUTHOR, "output": "⏹ Stopped."})
    assert await query(sqlite_url(tmp_path / "chat.db"), "SELECT id FROM steps") == ["s"]


async def test_a_write_for_a_thread_another_process_deleted_is_no_storage_failure(
    store: HistoryStore, db_url: str
) -> None:
    """Its foreign key fails (the thread is gone); the chat is told nothing, since nothing is broken."""
    gone = str(uuid.uuid4())  # never created here: as if another app process had deleted it
    await store.upsert_feedback(Feedback(forId=str(uuid.uuid4()), value=0, threadId=gone))
    assert store.failures == 0 and store.problem is None
    assert await query(db_url, "SELECT COUNT(*) FROM feedbacks") == [0]


async def test_damaged_file_gives_a_clear_error_and_no_history(make_config: MakeConfig, tmp_path: Path) -> None:
    db = tmp_path / "data" / "chat.db"
    db.parent.mkdir()
    db.write_bytes(b"this is not an SQLite database, just some text that got here" * 100)
    persistence = Persistence()
    assert await persistence.open(make_config(), login=True) is None
    assert persistence.layer() is None
    problem = persistence.problem
    assert problem is not None
    assert str(db) in str(problem) and "damaged" in str(problem) and "move the file aside" in str(problem)
    mark = persistence.mark()
    assert persistence.news(mark) is problem, "a new chat hears of it once"
    assert persistence.news(mark) is None
    assert db.read_bytes().startswith(b"this is not"), "the file is left as it was"


async def test_locked_file_at_start(make_config: MakeConfig, tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        store = HistoryStore(sqlite_url(db), busy_timeout_s=0.2)
        with pytest.raises(StorageError, match="locked") as err:
            await store.prepare()
        assert "close it" in str(err.value)
        # The driver's own words stay as they are; the sentence and what to do are Chinese.
        assert err.value.text("zh-CN").startswith(f"对话数据库（{db}）在打开数据库时出错：database is locked。")
        assert "另一个程序锁住了" in err.value.text("zh-CN")
        await store.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


async def test_failures_while_running_are_reported_once_per_chat(sqlite_store: HistoryStore, tmp_path: Path) -> None:
    store = sqlite_store
    persistence = Persistence()
    persistence.store = store
    mark = persistence.mark()
    alice = await store.create_user(User(identifier="alice"))
    assert alice is not None
    assert persistence.news(mark) is None

    holder = sqlite3.connect(tmp_path / "chat.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        await store.update_thread(str(uuid.uuid4()), name="x", user_id=alice.id)  # does not raise
        assert store.failures >= 1
        problem = persistence.news(mark)
        assert problem is not None and "locked" in str(problem)
        await store.update_thread(str(uuid.uuid4()), name="y", user_id=alice.id)
        assert persistence.news(mark) is None, "the same problem is told once"
        later_chat = persistence.mark()
        assert persistence.news(later_chat) is None, "a chat started after the failure is not told of it"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert await store.get_user("alice") is not None, "works again once the lock is gone"


async def test_errors_do_not_carry_chat_text(store: HistoryStore, caplog: pytest.LogCaptureFixture) -> None:
    await store.execute_sql("INSERT INTO nowhere (a) VALUES (:a)", {"a": "my private message"})
    missing = "no such table: nowhere" if store.dialect == "sqlite" else 'relation "nowhere" does not exist'
    assert store.problem is not None and missing in str(store.problem)
    assert store.problem.code == "storage.failed", "a missing table is no login problem (storage.refused)"
    assert missing in caplog.text, "the failure is logged (so the log is where the text could have leaked)"
    assert "my private message" not in caplog.text and "my private message" not in str(store.problem)


async def test_storage_only_with_login(make_config: MakeConfig, tmp_path: Path) -> None:
    persistence = Persistence()
    assert await persistence.open(make_config(), login=False) is None
    assert await persistence.open(make_config(storage__enabled="false"), login=True) is None
    assert not (tmp_path / "data" / "chat.db").exists()
    assert persistence.problem is None and persistence.news(persistence.mark()) is None
    store = await persistence.open(make_config(), login=True)
    assert store is not None and (tmp_path / "data" / "chat.db").exists()
    assert stat.S_IMODE((tmp_path / "data" / "chat.db").stat().st_mode) == 0o600
    async with store.engine.connect() as conn:
        assert (await conn.execute(text("SELECT COUNT(*) FROM users"))).scalar() == 0
    await store.close()


async def test_bad_database_url(make_config: MakeConfig) -> None:
    persistence = Persistence()
    cfg = make_config(storage__database_url="nonsense://user:hunter2@host/db")
    assert await persistence.open(cfg, login=True) is None
    assert persistence.problem is not None
    assert "hunter2" not in str(persistence.problem) and "storage.database_url" in str(persistence.problem)


def test_database_url_default_and_redaction(make_config: MakeConfig, tmp_path: Path) -> None:
    assert database_url(make_config()) == f"sqlite+aiosqlite:///{tmp_path / 'data' / 'chat.db'}"
    url = "postgresql+asyncpg://chat:hunter2@db/chat"
    cfg = make_config(storage__database_url=url)
    assert database_url(cfg) == url
    for plain in ("postgres://chat:pw@db/chat", "postgresql://chat:pw@db/chat"):  # a hosting service's DATABASE_URL
        assert database_url(make_config(storage__database_url=plain)) == "postgresql+asyncpg://chat:pw@db/chat"
    assert (
        database_url(make_config(storage__database_url="sqlite:////srv/chat.db")) == "sqlite+aiosqlite:////srv/chat.db"
    )
    assert "hunter2" not in str(cfg.model_dump(mode="json"))
    assert redact(url) == "postgresql+asyncpg://chat:***@db/chat"


async def test_an_unreachable_or_refusing_server_says_what_to_check(
    postgres: PostgresForTests, make_config: MakeConfig
) -> None:
    url = make_url(postgres.new_database())
    closed = url.set(port=free_port())  # nothing listens there
    for wrong, code, words in [
        (closed, "storage.unreachable", "is running and reachable"),
        (url.set(password="not-the-password"), "storage.refused", "password authentication failed"),
        (url.set(database="no_such_database"), "storage.refused", '"no_such_database" does not exist'),
    ]:
        persistence = Persistence()
        cfg = make_config(storage__database_url=wrong.render_as_string(hide_password=False))
        assert await persistence.open(cfg, login=True) is None, "the chat goes on without history"
        problem = persistence.problem
        assert problem is not None and problem.code == code and words in str(problem), str(problem)
        assert "not-the-password" not in str(problem) and str(url.password) not in str(problem)
        assert problem.text("zh-CN").startswith("对话数据库（postgresql+asyncpg://")
