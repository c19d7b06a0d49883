"""Logins in the database (SQLite and PostgreSQL): failed attempts throttled per name and per address with a wait that
doubles up to its bound, attempts at once counted at once, a success clearing the name's count; ended sessions refused
by every process that shares the database."""

from __future__ import annotations

import asyncio

import pytest

from backend.api.logins import Logins, wait_s
from backend.config import LoginThrottle
from backend.errors import LoginThrottledError
from backend.storage.shared import SharedDatabase
from tests.unit.storage.conftest import Clock

THROTTLE = LoginThrottle(per_name=3, per_address=5, max_wait_s=8, window_s=900)


def test_the_wait_doubles_from_one_second_up_to_its_bound() -> None:
    assert wait_s([10.0, 11.0], free=3, max_wait_s=8, now=12.0) == 0
    assert [wait_s([0.0] * n, free=3, max_wait_s=8, now=0.0) for n in range(3, 8)] == [1, 2, 4, 8, 8]
    assert wait_s([0.0, 5.0, 6.0], free=3, max_wait_s=8, now=6.5) == 0.5, "counted from the last attempt"


async def test_failures_of_one_name_make_its_next_attempts_wait_a_bounded_time(db: SharedDatabase) -> None:
    clock = Clock()
    logins = Logins(db, THROTTLE, 3600, clock)
    for n in range(3):
        await logins.admit("alice", f"10.0.0.{n}")  # failures (never succeeded), from three addresses
    waits = []
    for _ in range(6):  # an attacker who tries again as soon as allowed
        with pytest.raises(LoginThrottledError) as throttled:
            await logins.admit("alice", "10.0.0.9")
        waits.append(throttled.value.retry_after_s)
        assert throttled.value.code == "login.throttled"
        clock.now += throttled.value.retry_after_s
        await logins.admit("alice", "10.0.0.9")
    assert waits == [1, 2, 4, 8, 8, 8]
    with pytest.raises(LoginThrottledError):  # refused while it should wait, whatever the address
        await logins.admit("alice", "10.0.0.200")
    await logins.admit("bob", "10.0.0.200")  # another name is not held up


async def test_a_success_clears_the_names_count_and_is_not_a_failure_of_its_address(db: SharedDatabase) -> None:
    clock = Clock()
    logins = Logins(db, THROTTLE, 3600, clock)
    for _ in range(2):
        await logins.admit("alice", "10.0.0.1")
    await logins.succeeded(await logins.admit("alice", "10.0.0.1"))
    for _ in range(2):
        await logins.admit("alice", "10.0.0.1")  # two failures again: no wait (the count started over)
    for n in range(2):
        await logins.succeeded(await logins.admit(f"user{n}", "10.0.0.1"))  # successes count for no address
    await logins.admit("carol", "10.0.0.1")  # 5 failures from the address in all: the next one waits
    with pytest.raises(LoginThrottledError):
        await logins.admit("dave", "10.0.0.1")
    await logins.admit("dave", "10.0.0.2")  # from another address dave is not held up
    clock.now += THROTTLE.window_s + 1
    await logins.admit("dave", "10.0.0.1")  # failures older than the window no longer count


async def test_attempts_at_once_are_counted_at_once(db_url: str) -> None:
    """Two app processes (two engines on one database) and many attempts at the same moment: only the free ones get a
    password check."""
    dbs = [SharedDatabase(db_url) for _ in range(2)]
    await dbs[0].prepare()
    clock = Clock()
    sides = [Logins(db, THROTTLE, 3600, clock) for db in dbs]
    results = await asyncio.gather(
        *(sides[i % 2].admit("eve", f"10.1.0.{i}") for i in range(10)), return_exceptions=True
    )
    assert sum(not isinstance(r, BaseException) for r in results) == THROTTLE.per_name, results
    assert all(isinstance(r, LoginThrottledError) for r in results if isinstance(r, BaseException))
    for db in dbs:
        await db.close()


async def test_an_ended_session_is_refused_by_every_process(db_url: str) -> None:
    dbs = [SharedDatabase(db_url) for _ in range(2)]
    await dbs[0].prepare()
    here, there = (Logins(db, THROTTLE, 3600) for db in dbs)
    assert not await here.ended("a.b.c") and not await there.ended("a.b.c")
    await here.end("a.b.c")
    assert await here.ended("a.b.c")
    await asyncio.sleep(2.1)  # the other process asks the database again after CHECKED_S
    assert await there.ended("a.b.c") and not await there.ended("a.b.d")
    for db in dbs:
        await db.close()
