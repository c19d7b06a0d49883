"""Rebuilding the model's history from a saved thread's steps."""

from __future__ import annotations

import json

from backend.chat.saved import (
    ASKED_KEY,
    LIVE_KEY,
    TOKENS_KEY,
    TURN_KEY,
    asked_ids,
    counts_from_steps,
    counts_from_thread,
    history_from_steps,
    history_from_thread,
    live_steps,
    turn_metadata,
)


def step(kind: str, name: str, output: str, when: str, metadata: object = None) -> dict:
    return {"type": kind, "name": name, "output": output, "createdAt": when, "metadata": metadata or {}}


def reply(output: str, second: str, metadata: object) -> dict:
    """A model reply saved at that second of a test day."""
    return step("assistant_message", "Assistant", output, f"2026-01-01T00:00:{second}Z", metadata)


def test_turns_come_back_in_order_without_notices() -> None:
    steps = [
        step("assistant_message", "system", "ℹ️ demo model notice", "2026-01-01T00:00:00Z"),
        step("user_message", "alice", "/code sort a list", "2026-01-01T00:00:01Z"),
        reply("sorted(x)\n\n*Template: code*", "02", turn_metadata("Write Python code: sort a list", "sorted(x)")),
        step("assistant_message", "system", "⏳ The model server is restarting", "2026-01-01T00:00:03Z"),
        step("user_message", "alice", "and reversed?", "2026-01-01T00:00:04Z"),
        # stopped before any text: no turn, as in a live chat
        step("assistant_message", "Assistant", "⏹ Stopped.", "2026-01-01T00:00:05Z"),
        step("assistant_message", "Assistant", "Task manually stopped.", "2026-01-01T00:00:06Z"),
        step("user_message", "alice", "and reversed?", "2026-01-01T00:00:07Z"),
        # SQLite gives JSON as text
        reply("sorted(x, reverse=True)", "08", json.dumps(turn_metadata("and reversed?", "sorted(x, reverse=True)"))),
    ]
    expected = [
        {"role": "user", "content": "Write Python code: sort a list"},
        {"role": "assistant", "content": "sorted(x)"},
        {"role": "user", "content": "and reversed?"},
        {"role": "assistant", "content": "sorted(x, reverse=True)"},
    ]
    assert history_from_steps(steps) == expected
    assert history_from_steps(reversed(steps)) == expected, "ordered by time, not by list position"
    assert history_from_thread({"id": "t1", "steps": steps}) == expected


def test_damaged_metadata_is_skipped() -> None:
    steps = [
        step("assistant_message", "Assistant", "a", "1", "{not json"),
        step("assistant_message", "Assistant", "b", "2", {TURN_KEY: "not a list"}),
        step("assistant_message", "Assistant", "c", "3", {TURN_KEY: [{"role": "tool", "content": "x"}]}),
        step("assistant_message", "Assistant", "d", "4", {TURN_KEY: [{"role": "user", "content": 5}]}),
    ]
    assert history_from_steps(steps) == []
    assert history_from_thread({"id": "t2", "steps": None}) == []


def test_the_counts_kept_with_the_turns_come_back_with_them() -> None:
    steps = [
        step("user_message", "alice", "a", "1"),
        step("assistant_message", "Assistant", "b", "2", turn_metadata("a", "b", (5, 7), "old@vllm")),
        step("assistant_message", "Assistant", "d", "3", json.dumps(turn_metadata("c", "d", (6, None), "m@vllm"))),
        step("assistant_message", "Assistant", "f", "4", turn_metadata("e", "f")),  # saved before counts were kept
        step("assistant_message", "Assistant", "h", "5", turn_metadata("g", "h", (8, 9), "m@vllm")),
    ]
    assert len(history_from_steps(steps)) == 8
    # another model's counts (the first turn's) are not kept: counted again, once
    assert counts_from_steps(steps) == ([None, None, 6, None, None, None, 8, 9], "m@vllm")
    assert counts_from_thread({"id": "t", "steps": steps}) == counts_from_steps(steps)
    assert TOKENS_KEY not in turn_metadata("e", "f") and TOKENS_KEY not in turn_metadata("e", "f", (None, None), "m")


def test_damaged_counts_are_left_out() -> None:
    bad = [{"by": 5, "counts": [1, 2]}, {"by": "m", "counts": [1]}, {"by": "m", "counts": [-1, "x"]}, "x"]
    steps = [
        step("assistant_message", "Assistant", "b", str(i), turn_metadata("a", "b") | {TOKENS_KEY: value})
        for i, value in enumerate(bad)
    ]
    assert counts_from_steps(steps)[0] == [None] * 8
    assert counts_from_steps([]) == ([], "")


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


def test_a_reply_saved_while_it_was_written_is_found_by_its_mark() -> None:
    growing = step("assistant_message", "Assistant", "half", "1", turn_metadata("q", "half") | {LIVE_KEY: True})
    done = step("assistant_message", "Assistant", "whole", "2", json.dumps(turn_metadata("q", "whole")))
    assert live_steps([growing, done]) == [growing]
    assert history_from_steps([growing]) == turn_metadata("q", "half")[TURN_KEY], "what was written is kept"
