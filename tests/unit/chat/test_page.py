"""A resumed chat drops an edited message's turn as the chat that asked it did, and knows what it was told."""

from __future__ import annotations

import json

from backend.chat.saved import NOTICE_KEY, notices
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
