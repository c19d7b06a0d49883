"""Chainlit's construction pauses, taken off the event loop's way.

Chainlit 2.x makes every `cl.Message` and every `cl.Step` wait `time.sleep(0.001)` in its constructor (message.py,
step.py): a blocking sleep on the event loop, which sleeps 1.1-1.3 ms on the machines measured here. Three of them
stand between a user's message and the first text of its reply: Chainlit builds the message from the page's
payload, wraps `on_message` in a step, and the app builds the reply's message. Every other conversation of the
process waits meanwhile. The pause keeps the creation times of messages made one after another apart on clocks
of millisecond resolution; Chainlit takes a message's `created_at` when it is sent (not in the constructor), from
a clock of microsecond resolution on Linux, and the app sets the reply's own (backend.chat.page). Measured on
the AMD EPYC of results/app-share: the app's share of the first text of a fresh chat ~8.3 ms, ~3.5 ms of them
these pauses.

`without_construction_pauses()` gives those two modules a `time` whose `sleep` skips pauses of at most a
millisecond (longer sleeps, if Chainlit ever adds any, still sleep). Where Chainlit no longer holds `time` in
either module it changes nothing, and says so in the log (tests/unit/chat/test_pauses.py notices a Chainlit
release that no longer pauses, or pauses another way).
"""

from __future__ import annotations

import importlib
import logging
import time
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

PAUSE_S = 0.001  # the pause Chainlit's constructors take; shorter or equal sleeps are skipped
MODULES = ("chainlit.message", "chainlit.step")


class TimeWithoutPauses:
    """The `time` module less the constructor's pause: every other name is `time`'s own."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        if seconds > PAUSE_S:
            time.sleep(seconds)


def without_construction_pauses() -> list[str]:
    """Drop the pauses of Chainlit's message and step constructors; return the modules changed."""
    changed = []
    for name in MODULES:
        module: ModuleType = importlib.import_module(name)
        if getattr(module, "time", None) is time:
            module.time = TimeWithoutPauses()  # type: ignore[attr-defined]
            changed.append(name)
        elif not isinstance(getattr(module, "time", None), TimeWithoutPauses):
            log.info("%s holds no `time` module: its constructor's pause (if any) is left as it is", name)
    return changed
