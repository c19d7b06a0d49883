"""A restart that loses no reply: on SIGTERM the app drains before it stops.

The first SIGTERM closes the line in front of the engine (backend.chat.admission: a message or an API request now,
and those still waiting, are told the service is restarting and when it should be back; a page opened now says so
too), turns /livez and /healthz to 503 (a proxy in front of several app processes sends new sessions to another),
and lets the replies in flight finish for up to admission.drain_s seconds. A reply's place in the line is given back
as its last event comes, but the page's handler still renders its end after that (saves it, shows its details and
buttons, and only as it returns is the page told the turn ended: Chainlit's `task_end`); so within the same seconds
the drain also waits for those handlers (backend.chat.live: LiveReplies.rendered). Handing on as the last reply ended
closed the websockets under the ends still being rendered: a chat that never learnt its turn had ended. Then it hands
the signal to the web server's own handler (uvicorn's), which stops the app as before: it closes the websockets,
waits for the requests still open, and runs the app's shutdown, where replies still running are saved cut off by
the restart (backend.web.replies) and the engine is stopped; Chainlit's shutdown then exits the process at once.
A second SIGTERM (or SIGINT) stops at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from backend.chat.live import LiveReplies
from backend.chat.service import ChatService

log = logging.getLogger(__name__)

Handler = Callable[[int, FrameType | None], Any] | int | None


class Drain:
    """The app's drain on SIGTERM (install() after the web server has set its own signal handlers)."""

    def __init__(self, service: ChatService, replies: LiveReplies) -> None:
        self.service = service
        self.replies = replies  # the chat's replies, and the pages' handlers that show them
        self.started: float | None = None
        self._previous: Handler = None
        self._task: asyncio.Task[None] | None = None

    @property
    def draining(self) -> bool:
        return self.started is not None

    def install(self) -> None:
        """Take SIGTERM, keeping the web server's handler to hand it on once drained."""
        self._previous = signal.getsignal(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        signal.signal(signal.SIGTERM, lambda sig, frame: loop.call_soon_threadsafe(self._on_term, sig, frame))

    def _on_term(self, sig: int, frame: FrameType | None) -> None:
        if self.draining:  # asked twice: stop now
            self._hand_on(sig, frame)
            return
        self._task = asyncio.ensure_future(self.drain(sig, frame))

    async def drain(self, sig: int = signal.SIGTERM, frame: FrameType | None = None) -> None:
        """Close the line, wait for the replies in flight and for the pages' handlers that render their ends
        (admission.drain_s at most, for both), then stop as before."""
        a = self.service.cfg.admission
        self.started = time.monotonic()
        lines = self.service.lines()  # the line in front of the engine, and replies to a server that queues itself
        running = sum(len(line.running) for line in lines)
        log.warning("Draining for a restart: %d repl%s in flight, up to %.0f s", running,
                    "y" if running == 1 else "ies", a.drain_s)  # fmt: skip
        if lines:  # admission off: no line to close, nothing is drained
            for line in lines:
                line.close(a.restart_s)
            drained = all(await asyncio.gather(*(line.drained(a.drain_s) for line in lines)))
            left = sum(len(line.running) for line in lines)
            replies_s = time.monotonic() - self.started
            # each turn's end: the reply saved, its page told the turn ended (in what is left of the same drain_s)
            rendered = await self.replies.rendered(max(0.0, a.drain_s - replies_s))
            showing = len(self.replies.rendering)
            log.warning("Drained in %.1f s (the replies in %.1f s, then their pages' ends)%s%s",
                        time.monotonic() - self.started, replies_s,
                        "" if drained else f"; {left} still running are saved cut off",
                        "" if rendered else f"; {showing} page(s) still showing a turn's end")  # fmt: skip
        self._hand_on(sig, frame)

    def _hand_on(self, sig: int, frame: FrameType | None) -> None:
        previous = self._previous
        if callable(previous):
            previous(sig, frame)
        else:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGTERM)
