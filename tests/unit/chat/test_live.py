"""The registry of live replies (backend.chat.live) with a scripted turn in place of the engine: a reply runs in a
task of its own, any number of pages follow it from the text so far, only its owner finds it, a stop from any page
ends it, and a reply nobody watches stops after the configured time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from backend.chat.live import LiveReplies, LiveReply
from backend.chat.request import UserSettings
from backend.chat.turn import ChatSession, Done, Event, Notice, Started, Text
from tests.waiting import spin_until


class ScriptedTurn:
    """A turn whose pieces the test hands over one by one; a stop ends it as the service's does (stopped, with
    the text so far), and the stream is known to be closed."""

    def __init__(self) -> None:
        self.pieces: asyncio.Queue[str | None] = asyncio.Queue()
        self.closed = False

    async def events(self) -> AsyncGenerator[Event, None]:
        yield Notice("trimmed", {"dropped": 2})
        yield Started("asked")
        parts: list[str] = []
        ending = "finished"
        try:
            while (piece := await self.pieces.get()) is not None:
                parts.append(piece)
                yield Text(piece)
        except asyncio.CancelledError:
            ending = "stopped"
        finally:
            self.closed = True
        yield Done("".join(parts), "default", "no rule matched", "asked", ending)  # type: ignore[arg-type]


def chat() -> ChatSession:
    return ChatSession(UserSettings(0.7, 0.9, 64))


async def texts(reply: LiveReply, start: int = 0) -> tuple[str, Done | None]:
    """What a page following from `start` sees: the text, and how the reply ended."""
    shown, done = "", None
    async for event in reply.follow(start):
        if isinstance(event, Text):
            shown += event.text
        elif isinstance(event, Done):
            done = event
    return shown, done


async def test_pages_that_come_in_the_middle_see_the_text_so_far_and_the_rest_live() -> None:
    replies, turn = LiveReplies(detached_s=60), ScriptedTurn()
    reply = await replies.start("thread-1", "user:alice", "r1", "u1", chat(), turn.events())
    first = asyncio.create_task(texts(reply))
    for piece in ("Hello", ", wor"):
        turn.pieces.put_nowait(piece)
    await spin_until(lambda: reply.text == "Hello, wor")
    snapshot = reply.snapshot()
    assert snapshot.text == "Hello, wor"
    second = asyncio.create_task(texts(reply, snapshot.index))  # a reloaded page, a second tab
    turn.pieces.put_nowait("ld")
    turn.pieces.put_nowait(None)
    (one, done_one), (rest, done_two) = await first, await second
    assert one == snapshot.text + rest == "Hello, world"
    assert done_one is done_two and done_one is not None and done_one.ending == "finished"
    assert reply.snapshot().text == "Hello, world", "a page that comes after the end gets it whole, then its end"
    assert await texts(reply, reply.snapshot().index) == ("", done_one)


async def test_only_the_owner_finds_a_reply() -> None:
    replies, turn = LiveReplies(detached_s=60), ScriptedTurn()
    reply = await replies.start("thread-1", "user:alice", "r1", "u1", chat(), turn.events())
    assert replies.find("thread-1", "user:alice") is reply
    assert replies.find("thread-1", "user:bob") is None, "another user cannot attach"
    assert replies.find("thread-1", "tab:someone-else") is None
    assert replies.find("thread-2", "user:alice") is None
    turn.pieces.put_nowait(None)
    await reply.wait()


async def test_a_stop_from_any_page_closes_the_stream_and_ends_the_reply_as_stopped() -> None:
    replies, turn = LiveReplies(detached_s=60), ScriptedTurn()
    reply = await replies.start("thread-1", "user:alice", "r1", "u1", chat(), turn.events())
    turn.pieces.put_nowait("Once upon")
    await spin_until(lambda: reply.text == "Once upon")
    found = replies.find("thread-1", "user:alice")  # the reloaded page's stop button
    assert found is not None and found.stop()
    await reply.wait()
    assert turn.closed and reply.done is not None
    assert (reply.done.ending, reply.done.text) == ("stopped", "Once upon") and not reply.stopped_early
    assert not reply.stop(), "an ended reply stops no more"


async def test_a_stop_before_the_reply_began_ends_it_without_one() -> None:
    async def waiting() -> AsyncGenerator[Event, None]:
        await asyncio.Event().wait()  # the engine is still starting
        yield Text("never")

    replies = LiveReplies(detached_s=60)
    reply = await replies.start("thread-1", "user:alice", "r1", "u1", chat(), waiting())
    await asyncio.sleep(0)  # the task begins
    assert reply.stop()
    await reply.wait()
    assert reply.ended and reply.done is None and reply.events == [] and reply.stopped_early


async def test_a_reply_nobody_watches_goes_on_for_the_configured_time_then_stops() -> None:
    replies, turn = LiveReplies(detached_s=0.05), ScriptedTurn()
    reply = await replies.start("thread-1", "user:alice", "r1", "u1", chat(), turn.events())
    turn.pieces.put_nowait("partial")
    await spin_until(lambda: reply.text == "partial")
    reply.detach()  # the page was closed
    reply.attach()  # ... and came back in time
    reply.detach()  # closed again, for good
    await asyncio.wait_for(reply.wait(), 5)
    assert reply.done is not None and reply.done.ending == "stopped" and not reply.cut_off
    assert turn.closed


async def test_a_page_that_comes_back_keeps_the_reply_going() -> None:
    replies, turn = LiveReplies(detached_s=0.01), ScriptedTurn()
    reply = await replies.start("thread-1", "user:alice", "r1", "u1", chat(), turn.events())
    reply.detach()
    reply.attach()
    loop = asyncio.get_running_loop()
    passed = loop.create_future()
    loop.call_later(0.05, passed.set_result, None)  # well past the limit
    await passed
    assert not reply.ended
    turn.pieces.put_nowait(None)
    await reply.wait()
    assert reply.done is not None and reply.done.ending == "finished"


async def test_a_second_reply_on_a_thread_waits_for_the_first() -> None:
    replies, first, second = LiveReplies(detached_s=60), ScriptedTurn(), ScriptedTurn()
    one = await replies.start("thread-1", "user:alice", "r1", "u1", chat(), first.events())
    starting = asyncio.create_task(replies.start("thread-1", "user:alice", "r2", "u2", chat(), second.events()))
    await asyncio.sleep(0)
    assert not starting.done(), "a second tab's message waits for the reply being written"
    first.pieces.put_nowait(None)
    two = await starting
    assert one.ended and replies.find("thread-1", "user:alice") is two
    second.pieces.put_nowait(None)
    await two.wait()


@pytest.mark.parametrize("saved", [True, False])
async def test_a_shutdown_cuts_every_reply_off_and_waits_until_it_is_saved(saved: bool) -> None:
    replies, turn = LiveReplies(detached_s=60), ScriptedTurn()
    reply = await replies.start("thread-1", "user:alice", "r1", "u1", chat(), turn.events())
    turn.pieces.put_nowait("half")
    await spin_until(lambda: reply.text == "half")

    async def save() -> None:  # the page that asked it saves it as it ends
        await reply.wait()
        if saved:
            reply.saved.set()

    saving = asyncio.create_task(save())
    assert await replies.shutdown(timeout_s=0.2 if not saved else 5) == 1
    await saving
    assert reply.cut_off and reply.done is not None and reply.done.ending == "stopped"
    assert reply.saved.is_set() == saved


async def test_the_chats_of_pages_that_came_back_get_the_finished_turn() -> None:
    replies, turn, asking, other = LiveReplies(detached_s=60), ScriptedTurn(), chat(), chat()
    reply = await replies.start("thread-1", "user:alice", "r1", "u1", asking, turn.events())
    reply.share(other)  # a second tab: its own chat
    turn.pieces.put_nowait("Paris.")
    turn.pieces.put_nowait(None)
    await reply.wait()
    assert other.history == [{"role": "user", "content": "asked"}, {"role": "assistant", "content": "Paris."}]
    assert other.turn_ids == ["u1"]
    assert asking.history == [], "the asking chat's turn is the service's to keep"
    late = chat()
    reply.share(late)  # a page that came after the end
    assert late.history == other.history
