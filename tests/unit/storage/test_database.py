"""The conversation database on a real SQLite file: schema and migrations, Chainlit's data layer calls,
and a damaged or locked file (the chat goes on without history, with one clear message)."""

from __future__ import annotations

import sqlite3
import stat
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from chainlit.context import init_http_context
from chainlit.types import Feedback, Pagination, ThreadFilter
from chainlit.user import User
from sqlalchemy import text

from backend.storage.database import HistoryStore, StorageError, redact
from backend.storage.persistence import Persistence, database_url
from backend.storage.resume import history_from_thread, turn_metadata
from backend.storage.schema import LATEST, TABLES, VERSION_TABLE, create_tables
from tests.conftest import MakeConfig


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[HistoryStore]:
    init_http_context()  # Chainlit's data layer methods look at the current session
    db = HistoryStore(sqlite_url(tmp_path / "chat.db"), busy_timeout_s=0.2)
    assert await db.prepare() == LATEST
    yield db
    await db.close()


def columns(path: Path, table: str) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def test_ddl_is_generated_for_both_dialects() -> None:
    sqlite, postgres = create_tables("sqlite"), create_tables("postgresql")
    assert len(sqlite) == len(postgres) == len(TABLES) + 4
    assert '"metadata" JSONB' in postgres[0] and '"metadata" TEXT' in sqlite[0]
    assert '"tags" TEXT[]' in postgres[1] and '"id" UUID PRIMARY KEY' in postgres[2]


async def test_schema_is_created_and_recorded_once(store: HistoryStore, tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    for table, cols in TABLES.items():
        assert columns(db, table) == {c.split('"')[1] for c in cols}
    # every key Chainlit writes for a step has a column
    from chainlit.step import StepDict

    assert set(StepDict.__annotations__) - {"feedback"} <= columns(db, "steps")
    # a second start finds the schema done
    again = HistoryStore(sqlite_url(db))
    assert await again.prepare() == LATEST
    await again.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute(f"SELECT version FROM {VERSION_TABLE}").fetchall() == [(LATEST,)]
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_a_database_from_a_newer_app_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    with sqlite3.connect(db) as conn:
        conn.execute(f"CREATE TABLE {VERSION_TABLE} (version INTEGER NOT NULL, applied_at TEXT NOT NULL)")
        conn.execute(f"INSERT INTO {VERSION_TABLE} VALUES ({LATEST + 1}, 'later')")
    store = HistoryStore(sqlite_url(db))
    with pytest.raises(StorageError, match="newer version of the app") as err:
        await store.prepare()
    await store.close()
    assert err.value.code == "storage.newer_schema" and str(db) in str(err.value)
    assert err.value.text("zh-CN").startswith(f"无法使用对话数据库（{db}）：它的结构版本为 {LATEST + 1}")


async def test_migration_is_one_transaction(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    with sqlite3.connect(db) as conn:  # a table in the way with the wrong shape: the migration fails midway
        conn.execute("CREATE TABLE steps (x INTEGER)")
    store = HistoryStore(sqlite_url(db))
    with pytest.raises(StorageError):
        await store.prepare()
    await store.close()
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"steps"}, "nothing of the failed migration is left behind"


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


async def test_chainlit_data_layer_round_trip(store: HistoryStore, tmp_path: Path) -> None:
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

    await store.update_thread(thread, name="Arithmetic")
    reopened = HistoryStore(sqlite_url(tmp_path / "chat.db"))  # as after a restart
    assert await reopened.prepare() == LATEST
    again = await reopened.get_thread(thread)
    assert again is not None and again["name"] == "Arithmetic" and len(again["steps"]) == 3
    await reopened.close()

    await store.delete_thread(thread)
    assert await store.get_thread(thread) is None
    with sqlite3.connect(tmp_path / "chat.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM steps").fetchone() == (0,)


async def test_a_reply_saved_after_its_thread_was_deleted_neither_brings_it_back_nor_breaks_history(
    store: HistoryStore, tmp_path: Path
) -> None:
    """Chainlit saves a reply's steps in tasks of their own: the page's delete can come first."""
    thread = str(uuid.uuid4())
    await store.update_thread(thread, name="To be deleted")
    await store.delete_thread(thread)
    late = {"id": str(uuid.uuid4()), "threadId": thread, "name": "Assistant", "type": "assistant_message"}
    await store.create_step({**late, "output": "a late reply", "streaming": False, "createdAt": None})
    await store.update_step({**late, "output": "a late reply, updated", "streaming": False, "createdAt": None})
    await store.upsert_feedback(Feedback(forId=late["id"], value=1, threadId=thread))
    with sqlite3.connect(tmp_path / "chat.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM threads").fetchone() == (0,), "the thread stays deleted"
        assert conn.execute("SELECT COUNT(*) FROM steps").fetchone() == (0,)
    assert store.failures == 0 and store.problem is None


async def test_a_write_for_a_thread_another_process_deleted_is_no_storage_failure(
    store: HistoryStore, tmp_path: Path
) -> None:
    """Its foreign key fails (the thread is gone); the chat is told nothing, since nothing is broken."""
    gone = str(uuid.uuid4())  # never created here: as if another app process had deleted it
    await store.upsert_feedback(Feedback(forId=str(uuid.uuid4()), value=0, threadId=gone))
    assert store.failures == 0 and store.problem is None
    with sqlite3.connect(tmp_path / "chat.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM feedbacks").fetchone() == (0,)


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


async def test_failures_while_running_are_reported_once_per_chat(store: HistoryStore, tmp_path: Path) -> None:
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
    assert store.problem is not None and "no such table: nowhere" in str(store.problem)
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
    assert "hunter2" not in str(cfg.model_dump(mode="json"))
    assert redact(url) == "postgresql+asyncpg://chat:***@db/chat"
