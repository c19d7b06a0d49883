"""A resumed chat drops an edited message's turn as the chat that asked it did, and knows what it was told."""

from __future__ import annotations

import json

from backend.chat.saved import ASKED_KEY, NOTICE_KEY, SYSTEM_AUTHOR, notices, turn_metadata
from tests.unit.chat.test_demo_defaults import service


def test_a_resumed_session_edits_like_a_live_one() -> None:
    svc = service(demo=False)
    turns = [{"role": r, "content": f"{r}{i}"} for i in range(3) for r in ("user", "assistant")]
    # the oldest turn was saved before its asking id was kept: the ids are the latest turns'
    session = svc.resumed_session(list(turns), {}, ["u1", "u2"])
    assert session.turn_ids == ["u1", "u2"]
    assert session.forget_from("u1") == 2 and session.history == turns[:2]
    assert svc.resumed_session([], {}, ["u1"]).turn_ids == []


def test_a_resumed_chat_that_was_told_of_the_demo_model_is_not_told_again() -> None:
    svc = service(demo=True)
    told = notices([{"metadata": json.dumps({NOTICE_KEY: "demo"})}, {"metadata": {NOTICE_KEY: "trimmed"}}, {}])
    assert told == {"demo", "trimmed"}
    assert svc.resumed_session([], {}, told=told).demo_told
    assert not svc.resumed_session([], {}, told=notices([])).demo_told


def test_a_thread_becomes_its_chat_again() -> None:
    """ChatService.thread_session: the history and counts from the thread's saved replies, what asked them and what
    the chat was told from the steps the page shows."""
    svc = service(demo=True)
    reply = {"type": "assistant_message", "name": "ERNIE", "createdAt": "2026-01-01T00:00:01",
             "metadata": turn_metadata("hi", "hello", (3, 4), "m@e") | {ASKED_KEY: "u1"}}  # fmt: skip
    told = {"type": "assistant_message", "name": SYSTEM_AUTHOR, "metadata": {NOTICE_KEY: "demo"}}
    thread = {"id": "t1", "steps": [reply, told]}
    chat = svc.thread_session(thread, {}, thread["steps"])
    assert chat.history == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert (chat.tokens, chat.counted_by) == ([3, 4], "m@e")
    assert chat.turn_ids == ["u1"] and chat.demo_told
    assert svc.thread_session(thread, {}, []).turn_ids == [], "the steps shown (none here) say what asked the turns"
