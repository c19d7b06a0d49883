"""The drain on SIGTERM (backend.ops.drain) with a real line and real live replies, a scripted turn in place of the
engine and a page's handler in place of Chainlit's: the signal is handed on to the web server only once the replies
in flight have ended and the handlers that render their ends have returned (the reply saved, the page told the turn
ended), within admission.drain_s; a handler that does not return in time does not hold the restart."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncGenerator
from types import FrameType, SimpleNamespace
from typing import cast

import pytest

from backend.chat.admission import Admission
from backend.chat.live import LiveReplies
from backend.chat.request import UserSettings
from backend.chat.service import ChatService
from backend.chat.turn import ChatSession, Done, Event, Started, Text
from backend.ops.drain import Drain
from tests.waiting import spin_until


async def turn(line: Admission, pieces: asyncio.Queue[str | None]) -> AsyncGenerator[Event, None]:
    """A reply as the service streams one: its place in the line is given back only after its last event (as
    ChatService.reply's does), when the page's handler has yet to render its end."""
    ticket = line.join("alice")
    try:
        await ticket.wait()
        yield Started("asked")
        parts: list[str] = []
        while (piece := await pieces.get()) is not None:
            parts.append(piece)
            yield Text(piece)
        yield Done("".join(parts), "default", "no rule matched", "asked")  # type: ignore[arg-type]
    finally:
        ticket.leave()


class Page:
    """A page's handler of one message (app.py's on_message): asks the reply, follows it to its end, then renders
    the end (saves the reply, sends its details and buttons) until `rendering` is set; `ended` is Chainlit's
    task_end, sent as the handler returns."""

    def __init__(self, replies: LiveReplies, line: Admission, thread: str) -> None:
        self.replies, self.line, self.thread = replies, line, thread
        self.pieces: asyncio.Queue[str | None] = asyncio.Queue()
        self.rendering = asyncio.Event()
        self.ended = False

    async def handle(self) -> None:
        chat = ChatSession(UserSettings(0.7, 0.9, 64))
        reply = await self.replies.start(
            self.thread, "user:alice", f"r-{self.thread}", "u1", chat, turn(self.line, self.pieces)
        )
        await reply.wait()
        await self.rendering.wait()
        self.ended = True


def drain_of(line: Admission, replies: LiveReplies, drain_s: float, pages: list[Page]) -> tuple[Drain, list]:
    """A drain of a service with `line`; for each hand-on, whether each of `pages` had been told its turn ended."""
    admission = SimpleNamespace(drain_s=drain_s, restart_s=60)
    service = SimpleNamespace(cfg=SimpleNamespace(admission=admission), lines=lambda: [line])
    drain = Drain(cast(ChatService, service), replies)
    handed: list[list[bool]] = []

    def web_servers_handler(sig: int, frame: FrameType | None) -> None:  # uvicorn's: it stops the app
        handed.append([page.ended for page in pages])

    drain._previous = web_servers_handler
    return drain, handed


async def test_the_signal_is_handed_on_only_once_every_page_has_rendered_its_turns_end() -> None:
    line, replies = Admission(4, 8, 60, 15), LiveReplies(detached_s=60)
    pages = [Page(replies, line, f"thread-{i}") for i in range(2)]
    handlers = [asyncio.create_task(page.handle()) for page in pages]
    await spin_until(lambda: len(line.running) == 2)
    drain, handed = drain_of(line, replies, 30, pages)
    draining = asyncio.create_task(drain.drain())
    for page in pages:
        page.pieces.put_nowait("Once upon a time.")
        page.pieces.put_nowait(None)
    await spin_until(lambda: not line.running)  # both replies ended: the line is drained
    pages[0].rendering.set()
    await asyncio.sleep(0.05)
    assert handed == [], "the second page still renders its turn's end: the web server must not stop yet"
    pages[1].rendering.set()
    await asyncio.wait_for(draining, 5)
    assert handed == [[True, True]], "handed on after every page was told its turn ended, not before"
    await asyncio.gather(*handlers)
    assert not replies.rendering


async def test_a_page_that_never_ends_its_turn_does_not_hold_the_restart_past_drain_s(
    caplog: pytest.LogCaptureFixture,
) -> None:
    line, replies = Admission(4, 8, 60, 15), LiveReplies(detached_s=60)
    page = Page(replies, line, "thread-1")
    handler = asyncio.create_task(page.handle())
    await spin_until(lambda: len(line.running) == 1)
    drain, handed = drain_of(line, replies, 0.3, [page])
    with caplog.at_level(logging.WARNING, logger="backend.ops.drain"):
        draining = asyncio.create_task(drain.drain(signal.SIGTERM))
        page.pieces.put_nowait(None)  # the reply ends; its page's handler hangs in rendering its end
        await asyncio.wait_for(draining, 5)
    assert handed == [[False]]
    assert "1 page(s) still showing a turn's end" in caplog.text
    handler.cancel()
    await asyncio.gather(handler, return_exceptions=True)


async def test_a_page_that_came_back_and_follows_a_reply_is_waited_for_too() -> None:
    """A reloaded page or a second tab follows the reply in a task of its own (backend.web.replies): it sends its
    page the turn's end itself, so the drain waits for it as for the handler that asked."""
    line, replies = Admission(4, 8, 60, 15), LiveReplies(detached_s=60)
    page = Page(replies, line, "thread-1")
    handler = asyncio.create_task(page.handle())
    await spin_until(lambda: len(line.running) == 1)
    shown = asyncio.Event()
    live = replies.running("thread-1")
    assert live is not None

    async def follow() -> None:
        await live.wait()
        await shown.wait()

    replies.shown_by(asyncio.create_task(follow()))
    page.rendering.set()
    drain, handed = drain_of(line, replies, 30, [page])
    draining = asyncio.create_task(drain.drain())
    page.pieces.put_nowait(None)
    await spin_until(lambda: page.ended)
    await asyncio.sleep(0.05)
    assert handed == [], "the page that came back still shows the turn's end"
    shown.set()
    await asyncio.wait_for(draining, 5)
    assert handed == [[True]]
    await handler
