"""The tables Chainlit's SQLAlchemyDataLayer reads and writes, created and migrated on start.

Chainlit creates no tables itself. Each migration runs once, in one transaction, and is recorded in
`ernie_schema_version`; the same column list gives the SQLite and the PostgreSQL DDL."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncConnection

from backend.errors import StorageError

log = logging.getLogger(__name__)

VERSION_TABLE = "ernie_schema_version"
ADVISORY_LOCK_KEY = 4_510_203  # any constant shared by all instances of this app

# Portable column types -> each dialect's spelling. SQLite keeps JSON and lists as text.
TYPES: dict[str, dict[str, str]] = {
    "sqlite": {"id": "TEXT", "text": "TEXT", "json": "TEXT", "list": "TEXT", "bool": "INTEGER", "int": "INTEGER",
               "real": "REAL", "bigint": "INTEGER", "blob": "BLOB"},
    "postgresql": {"id": "UUID", "text": "TEXT", "json": "JSONB", "list": "TEXT[]", "bool": "BOOLEAN", "int": "INT",
                   "real": "DOUBLE PRECISION", "bigint": "BIGINT", "blob": "BYTEA"},
}  # fmt: skip

# Every key Chainlit 2.12 writes (chainlit/data/sql_alchemy.py, StepDict, ElementDict, Feedback) has a
# column: an INSERT naming an unknown column fails, and Chainlit only logs that.
TABLES: dict[str, list[str]] = {
    "users": [
        '"id" {id} PRIMARY KEY',
        '"identifier" {text} NOT NULL UNIQUE',
        '"metadata" {json} NOT NULL',
        '"createdAt" {text}',
    ],
    "threads": [
        '"id" {id} PRIMARY KEY',
        '"createdAt" {text}',
        '"name" {text}',
        '"userId" {id} REFERENCES users("id") ON DELETE CASCADE',
        '"userIdentifier" {text}',
        '"tags" {list}',
        '"metadata" {json}',
    ],
    "steps": [
        '"id" {id} PRIMARY KEY',
        '"name" {text} NOT NULL',
        '"type" {text} NOT NULL',
        '"threadId" {id} NOT NULL REFERENCES threads("id") ON DELETE CASCADE',
        '"parentId" {id}',
        '"command" {text}',
        '"modes" {json}',
        '"streaming" {bool} NOT NULL',
        '"waitForAnswer" {bool}',
        '"isError" {bool}',
        '"metadata" {json}',
        '"tags" {list}',
        '"input" {text}',
        '"output" {text}',
        '"createdAt" {text}',
        '"start" {text}',
        '"end" {text}',
        '"generation" {json}',
        '"showInput" {text}',
        '"defaultOpen" {bool}',
        '"autoCollapse" {bool}',
        '"language" {text}',
        '"icon" {text}',
        '"indent" {int}',
    ],
    "elements": [
        '"id" {id} PRIMARY KEY',
        '"threadId" {id} REFERENCES threads("id") ON DELETE CASCADE',
        '"type" {text}',
        '"url" {text}',
        '"chainlitKey" {text}',
        '"name" {text} NOT NULL',
        '"display" {text}',
        '"objectKey" {text}',
        '"size" {text}',
        '"page" {int}',
        '"language" {text}',
        '"forId" {id}',
        '"mime" {text}',
        '"props" {json}',
        '"autoPlay" {bool}',
        '"playerConfig" {json}',
    ],
    "feedbacks": [
        '"id" {id} PRIMARY KEY',
        '"forId" {id} NOT NULL',
        '"threadId" {id} REFERENCES threads("id") ON DELETE CASCADE',
        '"value" {int} NOT NULL',
        '"comment" {text}',
    ],
}

INDEXES = [
    'CREATE INDEX IF NOT EXISTS threads_user ON threads ("userId")',
    'CREATE INDEX IF NOT EXISTS steps_thread ON steps ("threadId", "createdAt")',
    'CREATE INDEX IF NOT EXISTS elements_thread ON elements ("threadId")',
    'CREATE INDEX IF NOT EXISTS feedbacks_step ON feedbacks ("forId")',
]


# The API's keys, the quotas' running counts and the usage per user and day (backend.api.keys,
# backend.storage.quotas): schema version 2.
# A key is kept as its SHA-256 only; `prefix` is its first characters, to tell keys apart in a list.
API_TABLES: dict[str, list[str]] = {
    "api_keys": [
        '"id" {text} PRIMARY KEY',
        '"user_name" {text} NOT NULL',
        '"name" {text} NOT NULL',
        '"prefix" {text} NOT NULL',
        '"key_hash" {text} NOT NULL UNIQUE',
        '"created_at" {text} NOT NULL',
        '"last_used_at" {text}',
        '"revoked_at" {text}',
    ],
    "quota_leases": [  # one row per reply being written now
        '"id" {text} PRIMARY KEY',
        '"user_name" {text} NOT NULL',
        '"started" {real} NOT NULL',
    ],
    "quota_requests": [  # one row per request of the last minute
        '"user_name" {text} NOT NULL',
        '"at" {real} NOT NULL',
    ],
    "usage_daily": [
        '"user_name" {text} NOT NULL',
        '"day" {text} NOT NULL',
        '"route" {text} NOT NULL',  # chat or api
        '"requests" {bigint} NOT NULL',
        '"prompt_tokens" {bigint} NOT NULL',
        '"reply_tokens" {bigint} NOT NULL',
        'PRIMARY KEY ("user_name", "day", "route")',
    ],
}
API_INDEXES = [
    'CREATE INDEX IF NOT EXISTS api_keys_user ON api_keys ("user_name")',
    'CREATE INDEX IF NOT EXISTS quota_leases_user ON quota_leases ("user_name", "started")',
    'CREATE INDEX IF NOT EXISTS quota_requests_user ON quota_requests ("user_name", "at")',
]


# The template workshop's version history (backend.workshop.history), shared by every app process on the database:
# schema version 3. "body" is the whole text of the version, NULL for a deletion.
WORKSHOP_TABLES: dict[str, list[str]] = {
    "workshop_versions": [
        '"stem" {text} NOT NULL',
        '"number" {int} NOT NULL',
        '"tag" {text} NOT NULL',
        '"who" {text} NOT NULL',
        '"at" {text} NOT NULL',
        '"note" {text} NOT NULL',
        '"action" {text} NOT NULL',
        '"body" {text}',
        'PRIMARY KEY ("stem", "number")',
    ],
}


# Logins (backend.api.logins): each attempt of the last window, by "name:NAME" and by "address:ADDRESS" (an attempt is
# written before its password is checked and taken back when it succeeds), and the login tokens a logout ended (by
# their SHA-256; kept until the token would have expired anyway): schema version 4.
LOGIN_TABLES: dict[str, list[str]] = {
    "login_attempts": [
        '"id" {text} NOT NULL',
        '"key" {text} NOT NULL',
        '"at" {real} NOT NULL',
    ],
    "ended_sessions": [
        '"token_hash" {text} PRIMARY KEY',
        '"ended" {real} NOT NULL',
    ],
}
LOGIN_INDEXES = ['CREATE INDEX IF NOT EXISTS login_attempts_key ON login_attempts ("key", "at")']


# Documents as context (backend.documents): each user's files, their passages and the passages' terms (the index the
# retrieval's BM25 reads, the same on SQLite and PostgreSQL): schema version 5. `owner` is a login user ("user:NAME")
# or, without login, a browser tab ("tab:ID"), whose documents expire (`expires_at`, a Unix time) when it is gone.
DOCUMENT_TABLES: dict[str, list[str]] = {
    "documents": [
        '"id" {text} PRIMARY KEY',
        '"owner" {text} NOT NULL',
        '"name" {text} NOT NULL',
        '"kind" {text} NOT NULL',
        '"size" {bigint} NOT NULL',
        '"passages" {int} NOT NULL',
        '"created_at" {text} NOT NULL',
        '"expires_at" {real}',
        '"content" {blob} NOT NULL',
    ],
    "document_passages": [
        '"document_id" {text} NOT NULL REFERENCES documents("id") ON DELETE CASCADE',
        '"number" {int} NOT NULL',
        '"owner" {text} NOT NULL',
        '"page" {int}',
        '"heading" {text}',
        '"text" {text} NOT NULL',
        '"length" {int} NOT NULL',
        'PRIMARY KEY ("document_id", "number")',
    ],
    "document_terms": [
        '"document_id" {text} NOT NULL REFERENCES documents("id") ON DELETE CASCADE',
        '"number" {int} NOT NULL',
        '"owner" {text} NOT NULL',
        '"term" {text} NOT NULL',
        '"tf" {int} NOT NULL',
    ],
}
DOCUMENT_INDEXES = [
    'CREATE INDEX IF NOT EXISTS documents_owner ON documents ("owner", "created_at")',
    'CREATE INDEX IF NOT EXISTS document_passages_owner ON document_passages ("owner")',
    'CREATE INDEX IF NOT EXISTS document_terms_lookup ON document_terms ("owner", "term")',
    'CREATE INDEX IF NOT EXISTS document_terms_document ON document_terms ("document_id")',
]


# Accounts of the organisation's sign-in (backend.api.sso_accounts): one row per provider's user (issuer, subject),
# with the app's user name it got at its first sign-in and the role its groups gave at the last one (NULL: in no
# allowed group any more); and the links an admin made from a verified email to an existing password account:
# schema version 6.
SSO_TABLES: dict[str, list[str]] = {
    "sso_accounts": [
        '"issuer" {text} NOT NULL',
        '"subject" {text} NOT NULL',
        '"name" {text} NOT NULL UNIQUE',
        '"email" {text}',
        '"role" {text}',
        '"groups" {text} NOT NULL',
        '"signed_in_at" {real} NOT NULL',
        'PRIMARY KEY ("issuer", "subject")',
    ],
    "sso_links": [
        '"email" {text} PRIMARY KEY',
        '"name" {text} NOT NULL',
        '"linked_at" {real} NOT NULL',
    ],
}


class SchemaError(StorageError, RuntimeError):
    """The database's schema cannot be brought to the version this app needs."""


def create_tables(
    dialect: str, tables: dict[str, list[str]] | None = None, indexes: list[str] | None = None
) -> list[str]:
    """CREATE TABLE statements (in dependency order) and indexes for `dialect` (default: Chainlit's tables)."""
    types = TYPES[dialect]
    created = [
        f"CREATE TABLE IF NOT EXISTS {name} (\n    " + ",\n    ".join(c.format(**types) for c in columns) + "\n)"
        for name, columns in (TABLES if tables is None else tables).items()
    ]
    return created + (INDEXES if indexes is None else indexes)


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: dict[str, list[str]]  # by dialect


MIGRATIONS = [
    Migration(1, "Chainlit 2.12 tables", {d: create_tables(d) for d in TYPES}),
    Migration(2, "API keys, quotas and usage", {d: create_tables(d, API_TABLES, API_INDEXES) for d in TYPES}),
    Migration(3, "the template workshop's version history", {d: create_tables(d, WORKSHOP_TABLES, []) for d in TYPES}),
    Migration(4, "logins: attempts, ended sessions", {d: create_tables(d, LOGIN_TABLES, LOGIN_INDEXES) for d in TYPES}),
    Migration(5, "documents as context", {d: create_tables(d, DOCUMENT_TABLES, DOCUMENT_INDEXES) for d in TYPES}),
    Migration(6, "the organisation's sign-in: accounts, links", {d: create_tables(d, SSO_TABLES, []) for d in TYPES}),
    # Later changes go here as Migration(7, ..., {"sqlite": [...ALTER...], "postgresql": [...]}).
]
LATEST = MIGRATIONS[-1].version


async def current_version(conn: AsyncConnection) -> int:
    """The schema version recorded in the database (0 for a new one)."""
    await conn.execute(
        text(f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version INTEGER NOT NULL, applied_at TEXT NOT NULL)")
    )
    found = (await conn.execute(text(f"SELECT MAX(version) FROM {VERSION_TABLE}"))).scalar()
    return int(found or 0)


async def migrate(conn: AsyncConnection, where: str = "the database") -> int:
    """Apply the migrations the database lacks, in the caller's transaction; return the version reached.

    Raises SchemaError naming the database as `where` (its file, or its URL without the password)."""
    dialect = conn.dialect.name
    if dialect not in TYPES:
        raise SchemaError.of("storage.unsupported", where=where, dialect=dialect)
    if dialect == "postgresql":
        # Several app instances may start at once: one migrates, the others wait and find it done.
        await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
    version = await current_version(conn)
    if version > LATEST:
        raise SchemaError.of("storage.newer_schema", where=where, version=version, latest=LATEST)
    for migration in MIGRATIONS:
        if migration.version <= version:
            continue
        log.info("Database schema: applying %d (%s)", migration.version, migration.description)
        for statement in migration.statements[dialect]:
            await conn.execute(text(statement))
        await conn.execute(
            text(f"INSERT INTO {VERSION_TABLE} (version, applied_at) VALUES (:v, CURRENT_TIMESTAMP)"),
            {"v": migration.version},
        )
        version = migration.version
    missing = await missing_columns(conn)
    if missing:
        columns = ", ".join(f"{table}.{column}" for table, column in missing)
        raise SchemaError.of("storage.foreign_tables", where=where, columns=columns)
    return version


def _column_name(spec: str) -> str:
    return spec.split('"')[1]


async def missing_columns(conn: AsyncConnection) -> list[tuple[str, str]]:
    """(table, column) pairs Chainlit writes that the database lacks."""

    def check(sync_conn: Any) -> list[tuple[str, str]]:
        inspector = inspect(sync_conn)
        missing = []
        for table, specs in TABLES.items():
            have = {c["name"] for c in inspector.get_columns(table)}
            missing += [(table, _column_name(s)) for s in specs if _column_name(s) not in have]
        return missing

    return await conn.run_sync(check)
