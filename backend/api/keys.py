"""API keys: made at random, shown once, kept only as their SHA-256, named, listed and revoked per user."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text

from backend.errors import ApiError
from backend.storage.shared import SharedDatabase

KEY_PREFIX = "ek-"  # tells our keys apart from others in a tool's settings
SHOWN_CHARS = 10  # how much of a key a list shows ("ek-AbCdEfG…")
MAX_NAME = 64


def new_key() -> str:
    """A new secret key (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str) -> str:
    """What is stored of a key: its SHA-256 (a key is random enough that no slow hash is needed)."""
    return hashlib.sha256(key.encode()).hexdigest()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def check_key_name(name: str) -> str:
    """The name without surrounding blanks, or ApiError when it is empty, too long or has control characters (a NUL
    one PostgreSQL would refuse)."""
    name = " ".join(name.split())
    if not 1 <= len(name) <= MAX_NAME or not name.isprintable():
        raise ApiError.of("api.key_name")
    return name


@dataclass(frozen=True)
class KeyInfo:
    """A key as lists show it: never the key itself."""

    id: str
    user: str
    name: str
    prefix: str
    created_at: str
    last_used_at: str | None
    revoked_at: str | None

    def json(self) -> dict[str, Any]:
        return {"id": self.id, "user": self.user, "name": self.name, "prefix": self.prefix + "…",
                "created_at": self.created_at, "last_used_at": self.last_used_at,
                "revoked_at": self.revoked_at}  # fmt: skip


COLUMNS = '"id", "user_name", "name", "prefix", "created_at", "last_used_at", "revoked_at"'


def _info(row: Any) -> KeyInfo:
    return KeyInfo(*(None if value is None else str(value) for value in row))  # type: ignore[arg-type]


class KeyStore:
    """The api_keys table."""

    def __init__(self, db: SharedDatabase) -> None:
        self.db = db

    async def create(self, user: str, name: str) -> tuple[str, KeyInfo]:
        """A new key of `user` named `name`: (the key, to show once; its entry)."""
        key = new_key()
        info = KeyInfo(str(uuid.uuid4()), user, check_key_name(name), key[:SHOWN_CHARS], _now(), None, None)
        async with self.db.transaction() as conn:
            await conn.execute(
                text(
                    'INSERT INTO api_keys ("id", "user_name", "name", "prefix", "key_hash", "created_at") '
                    "VALUES (:id, :user, :name, :prefix, :hash, :at)"
                ),
                {
                    "id": info.id,
                    "user": user,
                    "name": info.name,
                    "prefix": info.prefix,
                    "hash": key_hash(key),
                    "at": info.created_at,
                },
            )
        return key, info

    async def list(self, user: str | None = None, revoked: bool = False) -> list[KeyInfo]:
        """The keys of `user` (everyone's: None), newest first; revoked ones too when asked."""
        where = ['"revoked_at" IS NULL'] if not revoked else []
        if user is not None:
            where.append('"user_name" = :user')
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        async with self.db.transaction() as conn:
            rows = await conn.execute(
                text(f'SELECT {COLUMNS} FROM api_keys{clause} ORDER BY "created_at" DESC'), {"user": user}
            )
            return [_info(row) for row in rows]

    async def revoke(self, key_id: str, user: str | None = None) -> KeyInfo:
        """Revoke a key (of `user`, or anyone's: None); ApiError api.no_such_key when there is none to revoke."""
        owner = ' AND "user_name" = :user' if user is not None else ""
        async with self.db.transaction() as conn:
            done = await conn.execute(
                text(f'UPDATE api_keys SET "revoked_at" = :at WHERE "id" = :id AND "revoked_at" IS NULL{owner}'),
                {"at": _now(), "id": key_id, "user": user},
            )
            if done.rowcount != 1:
                raise ApiError.of("api.no_such_key", key=key_id)
            row = (await conn.execute(text(f'SELECT {COLUMNS} FROM api_keys WHERE "id" = :id'), {"id": key_id})).one()
        return _info(row)

    async def owner(self, key: str) -> str | None:
        """The user whose valid (not revoked) key this is, or None; notes when it was last used."""
        async with self.db.transaction() as conn:
            row = (
                await conn.execute(
                    text('SELECT "id", "user_name" FROM api_keys WHERE "key_hash" = :hash AND "revoked_at" IS NULL'),
                    {"hash": key_hash(key)},
                )
            ).first()
            if row is None:
                return None
            await conn.execute(
                text('UPDATE api_keys SET "last_used_at" = :at WHERE "id" = :id'), {"at": _now(), "id": row[0]}
            )
        return str(row[1])
