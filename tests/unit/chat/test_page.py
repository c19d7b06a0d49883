"""A saved thread's steps give back which user message asked each kept turn, so an edit after a resume drops its
turn as it does in the chat that asked it."""

from __future__ import annotations

import json

from backend.chat.page import ASKED_KEY, asked_ids
from tests.unit.chat.test_demo_defaults import service


def test_the_asking_ids_come_from_the_replies_metadata_as_dict_or_sqlite_text() -> None:
    steps = [
        {"id": "u1", "type": "user_message", "metadata": {}},
        {"id": "r1", "type": "assistant_message", "metadata": {ASKED_KEY: "u1"}},
        {"id": "n", "type": "assistant_message", "metadata": None},  # a notice
        {"id": "u2", "type": "user_message", "metadata": "{}"},
        {"id": "r2", "type": "assistant_message", "metadata": json.dumps({ASKED_KEY: "u2"})},
        {"id": "bad", "type": "assistant_message", "metadata": "not json"},
    ]
    assert asked_ids(steps) == ["u1", "u2"]


def test_a_resumed_session_edits_like_a_live_one() -> None:
    svc = service(demo=False)
    turns = [{"role": r, "content": f"{r}{i}"} for i in range(3) for r in ("user", "assistant")]
    # the oldest turn was saved before its asking id was kept: the ids are the latest turns'
    session = svc.resumed_session(list(turns), {}, ["u1", "u2"])
    assert session.turn_ids == ["u1", "u2"]
    assert session.forget_from("u1") == 2 and session.history == turns[:2]
    assert svc.resumed_session([], {}, ["u1"]).turn_ids == []
