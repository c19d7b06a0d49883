"""The conversation database: Chainlit's SQLAlchemy data layer on SQLite or PostgreSQL, with our schema and
errors a person can act on (and that never carry chat text)."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from chainlit.data.sql_alchemy import SQLAlchemyDataLayer
from chainlit.step import StepDict
from chainlit.types import Feedback, ThreadDict
from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from backend.chat.saved import CHAINLIT_STOP_NOTICE, SYSTEM_AUTHOR
from backend.errors import Phrase, StorageError
from backend.storage.schema import migrate

log = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 10.0
DOING = ("opening", "creating", "saving")  # what storage_error's `doing` may be (Phrases storage.<doing>)
# A database server's (asyncpg's, the resolver's) words for: no server there; a server that will not let us in.
UNREACHABLE = (
    "connect call failed",
    "connection refused",
    "name or service not known",
    "name resolution",
    "no route to host",
    "timed out",
    "timeout",
)
REFUSED = ("authentication failed", "no pg_hba.conf entry", "not permitted to log in")
NUL = "\x00"


def without_nul(value: Any) -> Any:
    """`value` with the NUL characters taken out of every string in it (dict values and list items too).

    PostgreSQL's text and JSONB cannot hold NUL (it refuses the whole write: "invalid byte sequence for encoding
    UTF8: 0x00"), and a model can emit one as a byte token: the reply is kept without it, on SQLite alike, so both
    databases give back the same conversation. A NUL shows as nothing on the page."""
    if isinstance(value, str):
        return value.replace(NUL, "")
    if isinstance(value, dict):
        return {key: without_nul(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_nul(item) for item in value]
    return value


def redact(url: str) -> str:
    """The URL with its password hidden, for logs and messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "(an unreadable database URL)"


def _reason(exc: BaseException) -> str:
    """The driver's own words, without the SQL text and parameters SQLAlchemy adds (they hold chat text)."""
    inner = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    return str(inner).splitlines()[0] if str(inner) else type(inner).__name__


def _kind(reason: str) -> str:
    """The catalog code for a driver's reason: what the person should do differs with the cause."""
    low = reason.lower()
    if "locked" in low or "busy" in low:
        return "storage.locked"
    if "not a database" in low or "malformed" in low or "damaged" in low or "corrupt" in low:
        return "storage.damaged"
    if "unable to open" in low or "permission" in low or "read-only" in low or "readonly" in low:
        return "storage.no_access"
    if any(words in low for words in UNREACHABLE):
        return "storage.unreachable"
    if any(words in low for words in REFUSED) or (low.startswith(("database ", "role ")) and "does not exist" in low):
        return "storage.refused"
    return "storage.failed"


def storage_error(exc: BaseException, where: str, doing: str) -> StorageError:
    """A friendly StorageError for `exc`, which happened while `doing` (one of DOING) on the database at `where`."""
    reason = _reason(exc)
    return StorageError.of(_kind(reason), where=where, doing=Phrase(f"storage.{doing}"), reason=reason)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Transactions are begun by SQLAlchemy ("begin" below) so that DDL is transactional too.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA journal_mode = WAL")  # readers never wait for the writer
    finally:
        cursor.close()


def _sqlite_on_begin(conn: Any) -> None:
    conn.exec_driver_sql("BEGIN")


def _sqlite_on_begin_immediate(conn: Any) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def follow_sqlite_rules(engine: AsyncEngine, immediate: bool = False) -> None:
    """Give an engine on an SQLite file the app's connection rules (foreign keys, WAL, transactional DDL).

    `immediate`: every transaction takes the write lock at its start, waiting for it (the busy timeout). A
    transaction that reads and then writes must: in WAL mode, one that began reading and finds another writer's
    commit since cannot write, and fails at once with "database is locked" without waiting."""
    event.listen(engine.sync_engine, "connect", _sqlite_on_connect)
    event.listen(engine.sync_engine, "begin", _sqlite_on_begin_immediate if immediate else _sqlite_on_begin)


def open_engine(url: str, busy_timeout_s: float = SQLITE_BUSY_TIMEOUT_S, immediate: bool = False) -> AsyncEngine:
    """An async engine on the app's database with the same rules as the conversation store's (not Chainlit's)."""
    parsed = make_url(url)
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() == "sqlite":
        connect_args = {"timeout": busy_timeout_s}
    elif parsed.get_driver_name() == "asyncpg":
        connect_args = {"timeout": CONNECT_TIMEOUT_S}
    engine = create_async_engine(url, connect_args=connect_args)
    if parsed.get_backend_name() == "sqlite":
        follow_sqlite_rules(engine, immediate)
    return engine


async def migrate_database(engine: AsyncEngine, where: str) -> int:
    """Bring the schema of the database at `where` up to date in one transaction; StorageError when it cannot be
    opened or migrated. Returns the schema version."""
    try:
        async with engine.begin() as conn:
            return await migrate(conn, where)
    except (SQLAlchemyError, OSError) as exc:
        raise storage_error(exc, where, "opening") from exc


class HistoryStore(SQLAlchemyDataLayer):
    """Chainlit's SQL data layer with our schema, readable errors, and a 404 for unknown threads."""

    def __init__(self, url: str, busy_timeout_s: float = SQLITE_BUSY_TIMEOUT_S) -> None:
        self.where = redact(url)
        self.dialect = make_url(url).get_backend_name()
        sqlite = self.dialect == "sqlite"
        connect_args: dict[str, Any] | None = None
        if sqlite:
            self.where = make_url(url).database or self.where
            connect_args = {"timeout": busy_timeout_s}
        elif make_url(url).get_driver_name() == "asyncpg":
            connect_args = {"timeout": CONNECT_TIMEOUT_S}  # an unreachable server must not hold up the start for 60 s
        # Chainlit warns that files attached to messages are not kept: this app attaches none.
        chainlit_log = logging.getLogger("chainlit")
        level = chainlit_log.level
        chainlit_log.setLevel(logging.ERROR)
        try:
            super().__init__(url, connect_args=connect_args)
        finally:
            chainlit_log.setLevel(level)
        if sqlite:
            follow_sqlite_rules(self.engine)
        self.failures = 0
        self.problem: StorageError | None = None
        # Threads deleted by this process. Chainlit saves a reply's steps in tasks of their own, and its step
        # writes first upsert their thread: a write that comes after the thread's deletion would bring the
        # thread back, or fail on a foreign key and be reported as a broken database to every chat.
        self.deleted: set[str] = set()

    async def prepare(self) -> int:
        """Check the database and bring its schema up to date; raise StorageError. Returns the schema version."""
        try:
            async with self.engine.begin() as conn:
                if self.dialect == "sqlite":
                    rows = (await conn.execute(text("PRAGMA quick_check"))).scalars().all()
                    if rows != ["ok"]:
                        found = "; ".join(map(str, rows[:3]))
                        raise StorageError.of("storage.check_failed", where=self.where, rows=found)
                return await migrate(conn, self.where)  # raises SchemaError, a StorageError
        except (SQLAlchemyError, OSError) as exc:
            raise storage_error(exc, self.where, "opening") from exc

    def _bindable(self, value: Any) -> Any:
        # Chainlit passes some JSON values as dicts and tag lists as lists; SQLite stores both as text. JSON that
        # Chainlit encoded itself (a step's and a thread's metadata) arrives as a string whose NULs are escapes this
        # cannot see: create_step and update_thread take them out before.
        value = without_nul(value)
        if isinstance(value, dict) or (isinstance(value, list) and self.dialect == "sqlite"):
            return json.dumps(value, ensure_ascii=False)
        return value

    async def execute_sql(self, query: str, parameters: dict) -> list[dict[str, Any]] | int | None:
        """Run one statement in its own transaction; on failure record the problem and return None."""
        params = {key: self._bindable(value) for key, value in parameters.items()}
        try:
            async with self.async_session() as session, session.begin():
                result = await session.execute(text(query), params)
                rows = [dict(row._mapping) for row in result.fetchall()] if result.returns_rows else None
                count = result.rowcount
        except Exception as exc:  # the chat must go on without history, whatever the driver raised
            self._failed(exc)
            return None
        if rows is None:
            return count
        return self.clean_result(rows)

    async def delete_thread(self, thread_id: str) -> None:
        self.deleted.add(thread_id)
        await super().delete_thread(thread_id)

    async def update_thread(
        self,
        thread_id: str,
        name: str | None = None,
        user_id: str | None = None,
        metadata: dict | None = None,
        tags: list[str] | None = None,
    ) -> None:
        if thread_id in self.deleted:
            log.debug("not saved: thread %s was deleted", thread_id)
            return
        await super().update_thread(thread_id, name=name, user_id=user_id, metadata=without_nul(metadata), tags=tags)

    async def create_step(self, step_dict: StepDict) -> None:  # update_step comes here too
        if step_dict.get("threadId") in self.deleted:
            log.debug("not saved: a step of deleted thread %s", step_dict.get("threadId"))
            return
        if step_dict.get("output") == CHAINLIT_STOP_NOTICE and step_dict.get("name") != SYSTEM_AUTHOR:
            return  # the page removes it at once: saved, it came back in the reopened thread
        await super().create_step(without_nul(step_dict))

    async def upsert_feedback(self, feedback: Feedback) -> str:
        if feedback.threadId in self.deleted:
            log.debug("not saved: feedback on deleted thread %s", feedback.threadId)
            return feedback.id or ""
        return await super().upsert_feedback(feedback)

    def _failed(self, exc: BaseException) -> None:
        if isinstance(exc, IntegrityError) and "foreign key" in _reason(exc).lower():
            # What a write still under way when its thread was deleted meets (see `deleted`): nothing is broken.
            log.info("not saved: %s (its conversation was deleted meanwhile)", _reason(exc))
            return
        problem = storage_error(exc, self.where, "saving")
        self.failures += 1
        if self.problem is None or str(problem) != str(self.problem):
            log.error("%s", problem)
        else:
            log.debug("%s (again)", problem)
        self.problem = problem

    async def get_thread_author(self, thread_id: str) -> str:
        """The thread's owner, or "" for an unknown thread (Chainlit then answers 404, not 500)."""
        if not _is_uuid(thread_id):
            return ""
        rows = await self.execute_sql('SELECT "userIdentifier" FROM threads WHERE "id" = :id', {"id": thread_id})
        if isinstance(rows, list) and rows and rows[0].get("userIdentifier"):
            return str(rows[0]["userIdentifier"])
        return ""

    async def step_owner(self, step_id: str) -> tuple[str, str]:
        """(the owner, the thread) of a message, or ("", "") for an unknown one."""
        if not _is_uuid(step_id):
            return "", ""
        rows = await self.execute_sql(
            'SELECT t."userIdentifier" AS owner, s."threadId" AS thread FROM steps s JOIN threads t ON t."id" = '
            's."threadId" WHERE s."id" = :id',
            {"id": step_id},
        )
        if isinstance(rows, list) and rows and rows[0].get("owner"):
            return str(rows[0]["owner"]), str(rows[0]["thread"])
        return "", ""

    async def feedback_step(self, feedback_id: str) -> str | None:
        """The message a feedback is about, or None for an unknown feedback."""
        if not _is_uuid(feedback_id):
            return None
        rows = await self.execute_sql('SELECT "forId" FROM feedbacks WHERE "id" = :id', {"id": feedback_id})
        return str(rows[0]["forId"]) if isinstance(rows, list) and rows else None

    async def get_thread(self, thread_id: str) -> ThreadDict | None:
        """The thread with its steps, or None (an id that is no UUID is unknown, not a database error)."""
        return await super().get_thread(thread_id) if _is_uuid(thread_id) else None


def _is_uuid(value: str) -> bool:
    # Chainlit's ids are UUIDs; PostgreSQL rejects anything else with an error we would report as a failure.
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True
