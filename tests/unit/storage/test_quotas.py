"""Quotas in the database (SQLite and PostgreSQL): replies at once, requests per minute, tokens per day, with
Retry-After figures; per-user overrides; two users never share; two app processes cannot double a share."""

from __future__ import annotations

import asyncio

import pytest

from backend.config import ApiSettings, QuotaLimits
from backend.errors import QuotaError
from backend.storage.quotas import BUSY_RETRY_S, Quotas, seconds_to_midnight, utc_day
from backend.storage.shared import SharedDatabase
from tests.unit.storage.conftest import NOON, Clock


def settings(**limits: int) -> ApiSettings:
    base = {"concurrent": 0, "requests_per_minute": 0, "tokens_per_day": 0} | limits
    return ApiSettings(quotas=QuotaLimits(**base))


def test_days_and_midnight_are_utc() -> None:
    assert utc_day(NOON) == "2026-01-01"
    assert seconds_to_midnight(NOON) == 12 * 3600


def test_an_override_changes_only_its_keys() -> None:
    cfg = ApiSettings.model_validate({"overrides": {"alice": {"tokens_per_day": 5}}})
    assert cfg.limits("alice") == QuotaLimits(concurrent=2, requests_per_minute=30, tokens_per_day=5)
    assert cfg.limits("bob") == cfg.quotas


async def test_concurrent_replies_are_limited_per_user(db: SharedDatabase) -> None:
    quotas = Quotas(db, settings(concurrent=2), Clock())
    first, second = await quotas.admit("alice", "api"), await quotas.admit("alice", "chat")
    with pytest.raises(QuotaError) as over:
        await quotas.admit("alice", "api")
    assert over.value.code == "quota.concurrent" and over.value.retry_after_s > 0
    await quotas.admit("bob", "api")  # another user's places are their own
    await quotas.release(first)
    third = await quotas.admit("alice", "api")  # a place came free
    for lease in (second, third):
        await quotas.release(lease)


async def test_requests_per_minute_with_the_seconds_to_wait(db: SharedDatabase) -> None:
    clock = Clock()
    quotas = Quotas(db, settings(requests_per_minute=2), clock)
    await quotas.release(await quotas.admit("alice", "api"))
    clock.now += 20
    await quotas.release(await quotas.admit("alice", "api"))
    clock.now += 10
    with pytest.raises(QuotaError) as over:
        await quotas.admit("alice", "api")
    assert over.value.code == "quota.rate" and over.value.retry_after_s == 30  # the first one leaves the window
    assert "30 秒" in over.value.text("zh-CN")
    clock.now += 31
    await quotas.release(await quotas.admit("alice", "api"))


async def test_tokens_per_day_count_chat_and_api_together_until_midnight(db: SharedDatabase) -> None:
    clock = Clock()
    quotas = Quotas(db, settings(tokens_per_day=100), clock)
    async with quotas.hold("alice", "chat") as lease:
        lease.record(40, 20)
    async with quotas.hold("alice", "api") as lease:
        lease.record(30, 10)
    await asyncio.sleep(0.05)  # the release runs in its own task
    with pytest.raises(QuotaError) as over:
        await quotas.admit("alice", "api")
    assert over.value.code == "quota.tokens" and over.value.params["used"] == 100
    assert over.value.retry_after_s == 12 * 3600
    await quotas.release(await quotas.admit("bob", "api"))
    rows = {(r.user, r.route): r for r in await quotas.usage()}
    assert (rows["alice", "chat"].prompt_tokens, rows["alice", "chat"].reply_tokens) == (40, 20)
    assert (rows["alice", "api"].requests, rows["alice", "api"].prompt_tokens) == (1, 30)
    clock.now += 12 * 3600 + 1  # a new UTC day
    await quotas.admit("alice", "api")


async def test_a_refused_request_takes_no_place(db: SharedDatabase) -> None:
    quotas = Quotas(db, settings(concurrent=1, requests_per_minute=5), Clock())
    lease = await quotas.admit("alice", "api")
    for _ in range(3):
        with pytest.raises(QuotaError):
            await quotas.admit("alice", "api")
    await quotas.release(lease)
    await quotas.admit("alice", "api")  # 2 requests counted in the minute, not 5


async def test_a_dead_process_s_lease_goes_stale(db: SharedDatabase) -> None:
    clock = Clock()
    quotas = Quotas(db, settings(concurrent=1).model_copy(update={"lease_s": 60}), clock)
    await quotas.admit("alice", "api")  # never released
    clock.now += 59
    with pytest.raises(QuotaError):  # still within its lease: the place is taken
        await quotas.admit("alice", "api")
    clock.now += 2
    await quotas.admit("alice", "api")


async def test_two_processes_cannot_double_a_share(db_url: str) -> None:
    """Two app processes are two connections (engines) on one database: of many admissions at once, exactly the
    limit gets through."""
    dbs = [SharedDatabase(db_url) for _ in range(2)]
    await dbs[0].prepare()
    clock = Clock()
    sides = [Quotas(db, settings(concurrent=3), clock) for db in dbs]
    results = await asyncio.gather(*(sides[i % 2].admit("alice", "api") for i in range(10)), return_exceptions=True)
    admitted = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, QuotaError)]
    assert (len(admitted), len(refused)) == (3, 7), results
    for db in dbs:
        await db.close()


async def test_a_withdrawn_request_frees_its_place_and_its_minute_and_adds_no_usage(db: SharedDatabase) -> None:
    """A request refused before the engine was asked for a reply (Gateway: an unknown template, a message too long)."""
    quotas = Quotas(db, settings(concurrent=1, requests_per_minute=1), Clock())
    await quotas.withdraw(await quotas.admit("alice", "api"))
    lease = await quotas.admit("alice", "api")  # the minute's one request and the one place are free again
    await quotas.release(lease)
    assert [(row.requests, row.route) for row in await quotas.usage("alice")] == [(1, "api")]
    await quotas.close()


async def test_retry_after_waits_for_a_dead_process_s_place_and_not_for_a_live_one(db: SharedDatabase) -> None:
    """A live process refreshes its places (every third of lease_s): while one holds a place, a few seconds may free
    it; a place no one refreshed is a dead process's, and frees itself lease_s after its last refresh."""
    clock = Clock()
    limits = settings(concurrent=1).model_copy(update={"lease_s": 60})
    dead, live = Quotas(db, limits, clock), Quotas(db, limits, clock)
    await dead.admit("alice", "api")
    await dead.close()  # a process killed: it refreshes nothing from now on
    held = await live.admit("bob", "api")
    clock.now += 45
    await live.refresh()
    for user, wait in (("alice", 15), ("bob", BUSY_RETRY_S)):
        with pytest.raises(QuotaError) as busy:
            await live.admit(user, "api")
        assert busy.value.retry_after_s == wait, user
    clock.now += 16
    await live.release(await live.admit("alice", "api"))  # the dead place went stale
    await live.release(held)
    await live.close()
