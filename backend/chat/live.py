"""Replies that belong to the server, not to a page: the registry of the replies being written in this process.

A reply runs as an asyncio task of its own (the engine's request included), not in the page's websocket task: a
page that is reloaded, closed or cut off stops watching it, and the reply goes on. It keeps every event of its turn
(the notices, the text so far, how it ended), and any number of pages follow it: the page that asked it, the same
thread reloaded or opened in a second tab. Each reply has an owner (the user, or without login the browser tab that
asked it), and only the owner's pages find it. With no page watching, a reply goes on for `detached_s`, then it is
stopped; an app that shuts down stops them all, marked cut off. Kept in memory: one process, as Chainlit's sessions.

A reply's end is not its page's end: after the last event the page's task still saves the reply, shows its details
and buttons, and only when that task returns is the page told the turn ended (Chainlit's `task_end`). So the registry
also knows the pages' tasks that show a reply (`shown_by`), and a drain for a restart waits for them (`rendered`):
stopping the web server as the last reply ends would close the websockets under the ends still being rendered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from backend.chat.turn import ChatSession, Done, Event, Text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    """What a page that comes in the middle of a reply shows at once: the text so far; it follows from `index`."""

    text: str
    index: int


class LiveReply:
    """One reply being written: its events so far, a wake-up for the pages that follow it, and its task."""

    def __init__(self, key: str, owner: str, reply_id: str, asked: str, session: ChatSession, detached_s: float):
        self.key, self.owner = key, owner  # the thread it belongs to; who may see it
        self.reply_id, self.asked = reply_id, asked  # the page's id of the reply message and of the user message
        self.session = session  # the chat that asked it (its history gets the turn)
        self.detached_s = detached_s
        self.events: list[Event] = []
        self.ended = False
        self.cut_off = False  # stopped by the app's shutdown, not by a person
        self.done: Done | None = None  # how it ended (None: no reply began: refused, or stopped before)
        self.stopped_early = False  # stopped before a reply began (the turn ended without one)
        self.saved = asyncio.Event()  # the page that asked it has saved it as it ended
        self.pages = 0  # pages following it now
        self._chats: list[ChatSession] = []  # the chats of other pages that show it (their history gets the turn too)
        self._changed = asyncio.Event()
        self._idle: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, turn: AsyncGenerator[Event, None]) -> None:
        """Run the turn in a task of its own."""
        self._task = asyncio.create_task(self._run(turn), name=f"reply-{self.reply_id}")
        if self.pages == 0:
            self._watch_idle()

    async def _run(self, turn: AsyncGenerator[Event, None]) -> None:
        # The task awaits nothing but the turn: a stop always lands inside it (in the stream, which ends the reply
        # as stopped, or before it, which ends the turn without a reply).
        try:
            async with aclosing(turn) as events:
                async for event in events:
                    self.events.append(event)
                    if isinstance(event, Done):
                        self.done = event
                        for chat in self._chats:
                            self._add_turn(chat)
                    self._wake()
        except asyncio.CancelledError:
            self.stopped_early = True
            log.info("Reply %s stopped before it began", self.reply_id)
        except Exception:
            log.exception("Reply %s failed", self.reply_id)
        finally:
            self.ended = True
            if self._idle is not None:
                self._idle.cancel()
            self._wake()

    def share(self, chat: ChatSession) -> None:
        """Another page's chat shows this reply: it gets the finished turn too (at once if it has ended)."""
        if chat is self.session or chat in self._chats:
            return
        self._chats.append(chat)
        if self.done is not None:
            self._add_turn(chat)

    def _add_turn(self, chat: ChatSession) -> None:
        done = self.done
        if done is not None and done.text:
            chat.add_turn(done.user_text, done.text, self.asked, done.tokens)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    @property
    def text(self) -> str:
        """The reply's text so far."""
        return "".join(event.text for event in self.events if isinstance(event, Text))

    def snapshot(self) -> Snapshot:
        """The text so far, and where a page that shows it follows on (its ending, if any, still to come)."""
        index = len(self.events) - (1 if self.done is not None else 0)
        return Snapshot("".join(e.text for e in self.events[:index] if isinstance(e, Text)), index)

    async def follow(self, start: int = 0) -> AsyncIterator[Event]:
        """The events from `start` on, as they come, to the end of the reply."""
        index = start
        while True:
            while index < len(self.events):
                yield self.events[index]
                index += 1
            if self.ended:
                return
            await self._changed.wait()

    async def wait(self) -> None:
        """Until the reply has ended."""
        while not self.ended:
            await self._changed.wait()

    def attach(self) -> None:
        """A page follows the reply now."""
        self.pages += 1
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def detach(self) -> None:
        """A page went away: with none left, the reply goes on for detached_s, then stops."""
        self.pages = max(0, self.pages - 1)
        if self.pages == 0 and not self.ended:
            self._watch_idle()

    def _watch_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._idle = asyncio.get_running_loop().call_later(self.detached_s, self._idle_too_long)

    def _idle_too_long(self) -> None:
        self._idle = None
        if self.pages == 0 and self.stop():
            log.info("Reply %s stopped: no page watched it for %.0f s", self.reply_id, self.detached_s)

    def stop(self, cut_off: bool = False) -> bool:
        """Stop the reply (the engine's request is closed, so the engine drops it); False if it had ended."""
        if self.ended or self._task is None:
            return False
        self.cut_off = self.cut_off or cut_off
        return self._task.cancel()


class LiveReplies:
    """The replies of this process by thread: one at a time per thread, found by their owner only."""

    def __init__(self, detached_s: float) -> None:
        self.detached_s = detached_s
        self._replies: dict[str, LiveReply] = {}
        self._endings: set[asyncio.Task[None]] = set()  # the tasks that forget ended replies (kept from the GC)
        self.rendering: set[asyncio.Task[Any]] = set()  # the pages' tasks showing a reply, to its end (shown_by)

    async def start(
        self, key: str, owner: str, reply_id: str, asked: str, session: ChatSession, turn: AsyncGenerator[Event, None]
    ) -> LiveReply:
        """Start a reply on thread `key` (after the one still being written there, if any: a second tab waits); the
        task that asks it shows it (a page's handler: shown_by)."""
        self.shown_by(asyncio.current_task())
        while (running := self._replies.get(key)) is not None and not running.ended:
            await running.wait()
        reply = LiveReply(key, owner, reply_id, asked, session, self.detached_s)
        reply.attach()  # the asking page watches it from the start
        self._replies[key] = reply
        reply.start(turn)
        ending = asyncio.create_task(self._forget_later(reply))
        self._endings.add(ending)
        ending.add_done_callback(self._endings.discard)
        return reply

    async def _forget_later(self, reply: LiveReply) -> None:
        """An ended reply stays findable for detached_s (a page that comes back after its end), then goes."""
        await reply.wait()

        def drop() -> None:
            if self._replies.get(reply.key) is reply:
                del self._replies[reply.key]

        asyncio.get_running_loop().call_later(self.detached_s, drop)

    def shown_by(self, task: asyncio.Task[Any] | None) -> None:
        """`task` shows a reply on a page to its end (the reply saved, its details and buttons, the turn's end sent):
        kept (from the GC too) until it returns, for a drain to wait for (rendered)."""
        if task is not None and not task.done() and task not in self.rendering:
            self.rendering.add(task)
            task.add_done_callback(self.rendering.discard)

    async def rendered(self, timeout_s: float) -> bool:
        """Wait until every page's task that showed a reply has returned (True) or `timeout_s` passes (False). One
        that starts meanwhile is waited for too (a message sent right after another waited for the first's end)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.rendering:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return False
            await asyncio.wait(set(self.rendering), timeout=left)
        return True

    def find(self, key: str, owner: str) -> LiveReply | None:
        """The newest reply of thread `key`, if `owner` asked it (nobody else sees it, not even that it exists)."""
        reply = self._replies.get(key)
        if reply is None:
            return None
        if reply.owner != owner:
            log.warning("A page of another owner asked for the reply of thread %s: refused", key)
            return None
        return reply

    def running(self, key: str) -> LiveReply | None:
        """The reply still being written on thread `key`, whoever owns it (to leave it out of a saved thread)."""
        reply = self._replies.get(key)
        return reply if reply is not None and not reply.ended else None

    async def shutdown(self, timeout_s: float = 10.0) -> int:
        """Stop every reply being written, marked cut off, and wait (a while) until each is saved; how many."""
        stopped = [reply for reply in self._replies.values() if reply.stop(cut_off=True)]
        if stopped:
            waits = [asyncio.ensure_future(reply.saved.wait()) for reply in stopped]
            _, pending = await asyncio.wait(waits, timeout=timeout_s)
            for wait in pending:
                wait.cancel()
            log.info("%d replies cut off by the shutdown (%d not saved in time)", len(stopped), len(pending))
        return len(stopped)
