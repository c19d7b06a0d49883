"""API keys on SQLite and PostgreSQL: made, listed (never the key itself), revoked, and only kept hashed."""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest
from sqlalchemy import text

from backend.api.keys import KEY_PREFIX, KeyStore, key_hash
from backend.errors import ApiError
from backend.storage.shared import SharedDatabase


@pytest.fixture
async def keys(db_url: str):  # type: ignore[no-untyped-def]
    db = SharedDatabase(db_url)
    await db.prepare()
    yield KeyStore(db)
    await db.close()


async def test_a_key_is_shown_once_and_kept_only_as_its_hash(keys: KeyStore) -> None:
    key, info = await keys.create("alice", "  my   editor ")
    assert key.startswith(KEY_PREFIX) and len(key) > 40
    assert info.name == "my editor" and info.user == "alice" and key.startswith(info.prefix)
    async with keys.db.transaction() as conn:
        stored = (await conn.execute(text("SELECT * FROM api_keys"))).mappings().one()
    assert key not in [str(v) for v in stored.values()], "the key itself is never stored"
    assert stored["key_hash"] == key_hash(key)
    assert key not in str(info.json())
    assert stored["last_used_at"] is None and info.last_used_at is None, "not used yet"
    assert await keys.owner(key) == "alice"
    used = (await keys.list("alice"))[0].last_used_at
    assert used is not None and datetime.fromisoformat(used) >= datetime.fromisoformat(info.created_at), "its use noted"


async def test_lists_are_per_user_and_a_revoked_key_stops_working(keys: KeyStore) -> None:
    alice_key, alice = await keys.create("alice", "a")
    _, bob = await keys.create("bob", "b")
    assert [k.id for k in await keys.list("alice")] == [alice.id]
    assert {k.id for k in await keys.list()} == {alice.id, bob.id}
    with pytest.raises(ApiError) as refused:
        await keys.revoke(alice.id, user="bob")  # not bob's key
    assert refused.value.code == "api.no_such_key"
    assert await keys.owner(alice_key) == "alice"
    assert alice.revoked_at is None
    revoked = await keys.revoke(alice.id, user="alice")
    assert (revoked.id, revoked.user) == (alice.id, "alice")
    assert revoked.revoked_at is not None
    assert datetime.fromisoformat(revoked.revoked_at) >= datetime.fromisoformat(alice.created_at)
    assert await keys.owner(alice_key) is None
    assert await keys.list("alice") == []
    assert [k.id for k in await keys.list("alice", revoked=True)] == [alice.id]
    with pytest.raises(ApiError):
        await keys.revoke(alice.id)  # already revoked
    assert await keys.owner("ek-wrong") is None


@pytest.mark.parametrize("name", ["", "   ", "x" * 65, "tool\x00", "a\x07b"])
async def test_a_key_needs_a_name(keys: KeyStore, name: str) -> None:
    with pytest.raises(ApiError) as refused:
        await keys.create("alice", name)
    assert refused.value.code == "api.key_name"
    assert refused.value.localized("zh-CN")[0].startswith("密钥名称")


async def test_two_processes_check_keys_at_once(db_url: str) -> None:
    """Checking a key reads, then notes its use: on SQLite two processes doing so at once must wait for each
    other, not fail with "database is locked"."""
    dbs = [SharedDatabase(db_url) for _ in range(2)]
    await dbs[0].prepare()
    stores = [KeyStore(db) for db in dbs]
    key, _ = await stores[0].create("alice", "k")
    owners = await asyncio.gather(*(stores[i % 2].owner(key) for i in range(20)))
    assert owners == ["alice"] * 20
    for db in dbs:
        await db.close()
