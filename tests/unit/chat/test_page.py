"""A resumed chat drops an edited message's turn as the chat that asked it did."""

from __future__ import annotations

from tests.unit.chat.test_demo_defaults import service


def test_a_resumed_session_edits_like_a_live_one() -> None:
    svc = service(demo=False)
    turns = [{"role": r, "content": f"{r}{i}"} for i in range(3) for r in ("user", "assistant")]
    # the oldest turn was saved before its asking id was kept: the ids are the latest turns'
    session = svc.resumed_session(list(turns), {}, ["u1", "u2"])
    assert session.turn_ids == ["u1", "u2"]
    assert session.forget_from("u1") == 2 and session.history == turns[:2]
    assert svc.resumed_session([], {}, ["u1"]).turn_ids == []
