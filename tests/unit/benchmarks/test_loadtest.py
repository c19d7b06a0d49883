"""The load tool's reading of what the page saw: the first text where the page gets it (stream_start), the
percentiles, and chats that grow or start fresh with every message."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from backend.benchmarks import loadtest
from backend.benchmarks.loadtest import (
    FIRST_TEXT,
    Reply,
    Report,
    first_text_at,
    last_text_at,
    loadtest_command,
    one_session,
    run,
)


def test_the_first_text_is_the_replys_stream_start_not_its_first_stream_token() -> None:
    events: list[tuple[str, Any]] = [
        ("task_start", None),
        ("new_message", {"name": "system", "output": "trimmed"}),
        ("stream_start", {"name": "system", "output": "never streamed, left out all the same"}),
        ("stream_start", {"name": "Assistant", "output": "Hel"}),  # the first text comes with it
        ("stream_token", {"token": "lo"}),
        ("update_message", {"name": "Assistant", "output": "Hello"}),
        ("task_end", None),
    ]
    times = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert first_text_at(events, times, 0, len(events)) == 0.3
    assert first_text_at(events, times, 4, len(events)) is None, "no reply began in that span"
    assert last_text_at(events, times, 0, len(events)) == 0.4, "the reply's last text: its last stream_token"
    assert last_text_at(events, times, 0, 4) == 0.3, "or the stream_start that carried all of it"
    assert last_text_at(events, times, 5, len(events)) is None


def test_the_summary_says_what_the_first_text_is_with_p50_p90_p99() -> None:
    report = Report(16, 60.0, "fresh")
    report.replies = [Reply(0, True, 1.0 + i / 100, i / 1000, 10) for i in range(101)]
    report.replies.append(Reply(1, False, 0.0, None, 0, "no reply"))
    summary = report.summary()
    assert (summary["chats"], summary["sessions"], summary["replies_ok"], summary["replies_failed"]) == (
        "fresh",
        16,
        101,
        1,
    )
    assert summary["first_text"] == FIRST_TEXT and "stream_start" in FIRST_TEXT
    assert summary["first_text_s"] == {"p50": 0.05, "p90": 0.09, "p99": 0.099}
    assert summary["latency_s"]["p50"] == 1.5 and summary["latency_s"]["p100"] == 2.0
    assert summary["errors"] == ["no reply"]
    assert Report(1, 1.0).summary()["first_text_s"] == {"p50": None, "p90": None, "p99": None}


def test_the_app_s_share_is_each_reply_s_first_text_less_the_engine_s() -> None:
    report = Report(1, 60.0, "growing")
    # first text at the page 20..119 ms, the engine's own 10 ms less for every reply, 3 of them unknown
    report.replies = [Reply(0, True, 1.0, (20 + i) / 1000, 5, "", i, (10 + i) / 1000, 100 + i) for i in range(100)]
    report.replies += [Reply(0, True, 1.0, 0.5, 5, "", 0, None, None) for _ in range(3)]
    summary = report.summary()
    assert summary["app_share_ms"] == pytest.approx({"p50": 10.0, "p90": 10.0, "p99": 10.0})
    assert summary["engine_first_text_s"]["p50"] == pytest.approx(0.0595, abs=1e-4)
    assert summary["prompt_tokens"] == {"p50": 149.5, "max": 199}
    assert Reply(0, True, 1.0, None, 0, "", 0, 0.01).app_share_s is None, "no first text: no share"
    assert Report(1, 1.0).summary()["app_share_ms"] == {"p50": None, "p90": None, "p99": None}


class FakeChat:
    opened = 0

    def __init__(self) -> None:
        FakeChat.opened += 1
        self.closed = False

    async def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(("chats", "opened", "turns"), [("growing", 1, [0, 1, 2]), ("fresh", 3, [0, 0, 0])])
async def test_a_growing_chat_keeps_its_chat_and_a_fresh_one_opens_one_per_message(
    monkeypatch: pytest.MonkeyPatch, chats: str, opened: int, turns: list[int]
) -> None:
    FakeChat.opened = 0
    asked: list[FakeChat] = []

    async def open_chat(url: str, max_tokens: int) -> FakeChat:
        return FakeChat()

    async def ask(chat: FakeChat, index: int, turn: int, text: str) -> Reply:
        asked.append(chat)
        return Reply(index, True, 0.1, 0.01, 5, turn=turn)

    monkeypatch.setattr(loadtest, "open_chat", open_chat)
    monkeypatch.setattr(loadtest, "ask", ask)
    report = Report(1, 1.0, chats)
    clock = itertools.chain([0.0, 1.0, 2.0], itertools.repeat(99.0))  # three messages before the deadline (10)
    monkeypatch.setattr(loadtest, "time", SimpleNamespace(monotonic=lambda: next(clock)))  # the module's clock only
    await one_session(0, "http://app", 10.0, 16, report, chats)
    assert [r.turn for r in report.replies] == turns
    assert FakeChat.opened == opened and all(chat.closed for chat in asked)


async def test_an_unknown_kind_of_chat_is_refused() -> None:
    with pytest.raises(ValueError, match="fresh, growing"):
        await run("http://app", 1, 1.0, 16, None, "old")


def test_each_kind_of_chat_runs_at_each_session_count_in_turn(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[tuple[str, int]] = []

    async def fake_run(
        url: str, sessions: int, duration_s: float, max_tokens: int, app_pid: int | None, chats: str, api_clients: int
    ):
        assert api_clients == 0
        ran.append((chats, sessions))
        report = Report(sessions, duration_s, chats)
        report.replies = [Reply(0, (chats, sessions) != ("growing", 16) or ok, 1.0, 0.1, 5)]
        return report

    monkeypatch.setattr(loadtest, "run", fake_run)
    ok = True
    assert loadtest_command("http://app", [1, 16], 5.0, 16, None, tmp_path, ["fresh", "growing"]) == 0
    assert ran == [("fresh", 1), ("fresh", 16), ("growing", 1), ("growing", 16)]
    levels = json.loads((tmp_path / "load.json").read_text())["levels"]
    assert [(lv["summary"]["chats"], lv["summary"]["sessions"]) for lv in levels] == ran
    assert capsys.readouterr().out.count('"first_text_s"') == 4, "a summary printed per run"
    ok = False
    assert loadtest_command("http://app", [16], 5.0, 16, None, tmp_path, ["growing"]) == 1, "a failed reply"


def test_the_line_is_read_from_the_apps_own_notices_and_estimates_judged_from_the_first_one_shown() -> None:
    from backend.chat.render import wait_text
    from backend.chat.turn import Queued

    measuring, timed = wait_text(Queued(7, None), "en-US"), wait_text(Queued(5, 42.0), "en-US")
    assert loadtest.IN_LINE.search(measuring) and loadtest.IN_LINE.search(timed)
    assert not loadtest.QUEUED.search(measuring), "no expected wait is read where none was shown"
    found = loadtest.QUEUED.search(timed)
    assert found is not None and found.groups() == ("5", "42")
    assert loadtest.QUEUED_LATE.search(wait_text(Queued(2, 9.0, late=True), "en-US"))

    def reply(**line: Any) -> Reply:
        return Reply(0, True, 10.0, 1.0, 5, **line)

    summary = loadtest.line_summary(
        [
            reply(place=7, waited_s=30.0),  # its turn came before any estimate was shown
            reply(place=5, expected_wait_s=40.0, waited_s=45.0, estimated_wait_s=20.0),  # 100 % off
            reply(place=3, expected_wait_s=12.0, waited_s=10.0, estimated_wait_s=10.0, told_late=True),  # 20 % off
            reply(),
        ]
    )
    assert summary["waited"] == 3 and summary["waited_without_estimate"] == 1 and summary["told_late"] == 1
    assert summary["wait_s"]["max"] == 45.0 and summary["estimates_within_half"] == 0.5


async def test_a_chat_told_the_server_is_busy_asks_again_when_the_page_said(monkeypatch: pytest.MonkeyPatch) -> None:
    from backend.chat.render import notice_text
    from backend.chat.turn import Refused
    from backend.errors import ServerFullError

    told = notice_text(Refused(ServerFullError.of("admission.full", waiting=64, retry_s=37)), "en-US")
    assert loadtest.BUSY.search(told) and (found := loadtest.RETRY.search(told)) and found.group(1) == "37"

    async def open_chat(url: str, max_tokens: int) -> FakeChat:
        return FakeChat()

    async def ask(chat: FakeChat, index: int, turn: int, text: str) -> Reply:
        busy = turn == 0
        return Reply(index, not busy, 0.1, None, 0, turn=turn, told_busy=busy, retry_after_s=37.0 if busy else None)

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(loadtest, "open_chat", open_chat)
    monkeypatch.setattr(loadtest, "ask", ask)
    monkeypatch.setattr(loadtest.asyncio, "sleep", sleep)
    clock = itertools.chain([0.0, 0.0, 1.0], itertools.repeat(99.0))
    monkeypatch.setattr(loadtest, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    await one_session(0, "http://app", 60.0, 16, Report(1, 1.0, "growing"), "growing")
    assert slept == [37.0], "once, after the busy answer, for as long as the page said"
