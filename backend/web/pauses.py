"""Chainlit's pauses on a message's way, taken off the event loop's way.

Chainlit 2.x makes every `cl.Message` and every `cl.Step` wait `time.sleep(0.001)` in its constructor (message.py,
step.py): a blocking sleep on the event loop, which sleeps 1.1-1.3 ms on the machines measured here. Three of them
stand between a user's message and the first text of its reply: Chainlit builds the message from the page's
payload, wraps `on_message` in a step, and the app builds the reply's message. Every other conversation of the
process waits meanwhile. The pause keeps the creation times of messages made one after another apart on clocks
of millisecond resolution; Chainlit takes a message's `created_at` when it is sent (not in the constructor), from
a clock of microsecond resolution on Linux, and the app sets the reply's own (backend.web.view). Measured on
the AMD EPYC of results/app-share: the app's share of the first text of a fresh chat ~8.3 ms, ~3.5 ms of them
these pauses.

A fourth pause: before it calls `on_message`, Chainlit's socket handler awaits `asyncio.sleep(0.001)` (socket.py,
`process_message`), after it has started the tasks that store the user's message and the thread. On the event loop
that wait lasts 1.1-2 ms (the loop's timer rounds up to its clock's millisecond); it lets those tasks start before
`on_message` runs, which one turn of the loop does as well (`asyncio.sleep(0)`): they write in their own time
either way, and Chainlit's SQL layer creates the thread with the first step it stores, whichever comes first.

`without_chainlit_pauses()` gives the two constructors' modules a `time` whose `sleep` skips pauses of at most a
millisecond, and the socket module an `asyncio` whose `sleep` of at most a millisecond is one turn of the loop
(longer sleeps, such as the session timeout's, sleep as before). Where Chainlit no longer holds `time` or `asyncio`
in those modules it changes nothing, and says so in the log (tests/unit/web/test_pauses.py notices a Chainlit
release that no longer pauses, or pauses another way).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from collections.abc import Awaitable
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

PAUSE_S = 0.001  # the pause Chainlit takes; shorter or equal sleeps are skipped (or one turn of the loop)
MODULES = ("chainlit.message", "chainlit.step")  # their constructors pause with time.sleep
SOCKET = "chainlit.socket"  # its message handler pauses with asyncio.sleep before on_message


class TimeWithoutPauses:
    """The `time` module less the constructor's pause: every other name is `time`'s own."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        if seconds > PAUSE_S:
            time.sleep(seconds)


class AsyncioWithoutPauses:
    """The `asyncio` module whose pause of at most PAUSE_S is one turn of the event loop: every other name is
    `asyncio`'s own."""

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    @staticmethod
    def sleep(seconds: float, result: Any = None) -> Awaitable[Any]:
        return asyncio.sleep(0 if seconds <= PAUSE_S else seconds, result)


def without_chainlit_pauses() -> list[str]:
    """Drop Chainlit's pauses on a message's way (its constructors', its handler's); return the modules changed."""
    replacements: list[tuple[str, str, ModuleType, type]] = [(SOCKET, "asyncio", asyncio, AsyncioWithoutPauses)]
    replacements += [(name, "time", time, TimeWithoutPauses) for name in MODULES]
    changed = []
    for name, attribute, original, replacement in replacements:
        module: ModuleType = importlib.import_module(name)
        held = getattr(module, attribute, None)
        if held is original:
            setattr(module, attribute, replacement())
            changed.append(name)
        elif not isinstance(held, replacement):
            log.info("%s holds no `%s` module: its pause (if any) is left as it is", name, attribute)
    return changed
