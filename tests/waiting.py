"""Waiting in tests: one polling loop (and its twin for a test's event loop), and one start-and-wait for a child
process (its probe AND that it lives); how long each waits by default is tests/deadlines.py's.

As vLLM's test server helper does: a child that dies fails the wait at once, with its exit code and its log's tail,
instead of after the timeout."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tests.deadlines import SPIN_S, WAIT_S

T = TypeVar("T")
TAIL_CHARS = 3000


def wait_until(probe: Callable[[], T | None], what: str, timeout: float = WAIT_S, interval: float = 0.2) -> T:
    """Poll `probe` until it returns something other than None or False, and return that (fail after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


async def until(
    probe: Callable[[], T | Awaitable[T | None] | None], what: str, timeout_s: float = WAIT_S, interval: float = 0.1
) -> T:
    """wait_until on the event loop: `probe` (plain or async) is polled between sleeps that let the loop run."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if inspect.isawaitable(value):
            value = await value
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(interval)


async def spin_until(condition: Callable[[], bool], timeout_s: float = SPIN_S) -> None:
    """Until `condition()` holds, the event loop turned without sleeping, so that the test's own tasks (a reply, a
    page) run between checks."""
    await until(condition, "the condition", timeout_s, interval=0)


def wait_alive(
    proc: subprocess.Popen[bytes],
    ready: Callable[[], bool],
    what: str,
    log: Callable[[], str],
    timeout: float = WAIT_S,
    interval: float = 0.2,
) -> None:
    """Wait until `ready()` while `proc` runs; its exit or the timeout fails with the tail of `log()`."""

    def probe() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode}:\n{log()[-TAIL_CHARS:]}")
        return ready()

    try:
        wait_until(probe, what, timeout, interval)
    except AssertionError as exc:
        if proc.poll() is None:  # the timeout: say what the log said
            raise AssertionError(f"{exc}:\n{log()[-TAIL_CHARS:]}") from None
        raise
