"""Many chat sessions at once through the app's real Chainlit websocket (Socket.IO), as browsers would.

    python -m backend loadtest --url http://127.0.0.1:8501 --sessions 1,16 --chats fresh,growing --duration 120

Each session connects like the web page, sends a message, reads the streamed reply to its end, and
repeats until the time is up (a reply under way is finished): in one chat that grows with every turn
(`growing`), or each message in a new chat (`fresh`, the chat opened before the clock starts). Each kind of
chat runs at each session count in turn, for `duration` seconds each. It reports completed and failed replies,
the first text and whole-reply latencies (P50/P90/P99), and the memory (RSS) of the app and its engine sampled
over time.

"First text" is when the page gets the reply's first text: Chainlit's `stream_start` event, which carries the
first piece (the `stream_token`s that follow carry the rest, so the first of those is one update late).

"The app's share" of a reply's first text is that time less the engine's: the reply's details give the time from
the app's request to the engine to its first text (`ttft_s`, the one streaming client's own clock, to the ms), so
what is left is the app's work around it (the page's message through Chainlit, the template, fitting the history
with its one count, the first piece's way back to the page).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from backend.benchmarks.chat_socket import ChatSocket, reply_finished
from backend.benchmarks.memory import tree_rss_bytes
from backend.benchmarks.stats import percentile
from backend.catalogue import CATALOG
from backend.chat.i18n import MESSAGES
from backend.chat.render import DETAILS_KEY

log = logging.getLogger(__name__)

PROMPTS = [
    "你好，请介绍一下你自己。",
    "What is the capital of France?",
    "Give me one tip for sleeping better.",
    "用一句话解释什么是人工智能。",
]


CHATS = ("fresh", "growing")  # each message in a new chat; one chat per session, growing with every turn
FIRST_TEXT = "when the page gets the reply's first text (Chainlit's stream_start), from the send"
APP_SHARE = "the first text less the engine's (the reply's details: from the app's request to the engine's first text)"
TAIL = "from the reply's last text on the page to its end (Chainlit's task_end: the details shown, the input free)"


@dataclass
class Reply:
    session: int
    ok: bool
    seconds: float
    first_text_s: float | None  # FIRST_TEXT
    chars: int
    error: str = ""
    turn: int = 0  # the message's place in its chat (0: a chat's first)
    engine_first_text_s: float | None = None  # the reply's details: the app's request to the engine's first text
    prompt_tokens: int | None = None  # what the engine read for it (the reply's details)
    taken_s: float | None = None  # when the page heard that the app took the message (Chainlit's task_start)
    tail_s: float | None = None  # TAIL: from the reply's last text on the page to the reply's end
    # The line in front of the engine (backend.chat.admission): the place the first "in line" notice showed, how
    # long the message waited from that notice to its first text, the first expected wait shown (none is shown until
    # the line has moved) and the wait that followed it, and whether it was told the server is busy instead.
    place: int | None = None
    expected_wait_s: float | None = None
    waited_s: float | None = None
    estimated_wait_s: float | None = None  # from the notice with the first expected wait to the first text
    told_busy: bool = False
    after_admission_s: float | None = None  # from the "your turn came" notice to the first text
    told_late: bool = False  # it waited past the line's bound and the page was told the wait is longer than expected
    retry_after_s: float | None = None  # told the server is busy: when the page said to try again

    @property
    def app_share_s(self) -> float | None:
        """APP_SHARE, when both times are known."""
        if self.first_text_s is None or self.engine_first_text_s is None:
            return None
        return self.first_text_s - self.engine_first_text_s


@dataclass
class ApiCall:
    """One request of an API client: its status, and its Retry-After where it was told to come back."""

    client: int
    status: int
    seconds: float
    retry_after_s: float | None = None
    chars: int = 0
    error: str = ""


@dataclass
class Report:
    sessions: int
    duration_s: float
    chats: str = "growing"
    replies: list[Reply] = field(default_factory=list)
    memory: list[dict[str, float]] = field(default_factory=list)
    api: list[ApiCall] = field(default_factory=list)  # the API clients' requests (--api-clients)
    pages: list[dict[str, float]] = field(default_factory=list)  # a new page's load time, sampled through the run

    def summary(self) -> dict[str, Any]:
        done = [r for r in self.replies if r.ok]
        lat = [r.seconds for r in done]
        first = [r.first_text_s for r in done if r.first_text_s is not None]
        share = [r.app_share_s * 1000 for r in done if r.app_share_s is not None]
        engine = [r.engine_first_text_s for r in done if r.engine_first_text_s is not None]
        prompts = [r.prompt_tokens for r in done if r.prompt_tokens is not None]

        def pct(values: list[float], *ps: float) -> dict[str, float | None]:
            return {f"p{p:g}": round(percentile(values, p), 4) if values else None for p in ps}

        rss = [m["app_mib"] + m["engine_mib"] for m in self.memory]
        third = max(1, len(rss) // 3)
        return {
            "chats": self.chats,
            "sessions": self.sessions,
            "duration_s": self.duration_s,
            "replies_ok": len(done),
            "replies_failed": len(self.replies) - len(done),
            "errors": sorted({r.error for r in self.replies if not r.ok}),
            "first_text": FIRST_TEXT,
            "first_text_s": pct(first, 50, 90, 99),
            "engine_first_text_s": pct(engine, 50, 90, 99),
            "app_share": APP_SHARE,
            "app_share_ms": pct(share, 50, 90, 99),
            "prompt_tokens": {"p50": statistics.median(prompts), "max": max(prompts)} if prompts else None,
            "latency_s": pct(lat, 50, 90, 99, 100),
            "turns_max": max((r.turn for r in done), default=0) + 1 if done else 0,
            "line": line_summary(self.replies),
            "api": api_summary(self.api) if self.api else None,
            "page_load_s": pct([p["seconds"] for p in self.pages], 50, 90, 100) if self.pages else None,
            "memory_mib": {
                "first_third_mean": round(statistics.mean(rss[:third]), 1) if rss else None,
                "last_third_mean": round(statistics.mean(rss[-third:]), 1) if rss else None,
                "max": round(max(rss), 1) if rss else None,
            },
        }


def line_summary(replies: list[Reply]) -> dict[str, Any]:
    """The line in front of the engine as the pages saw it: how many waited and how long (from the first "in line"
    notice to the first text), how many were told the server is busy, and how far the expected waits were off."""
    waited = [r for r in replies if r.waited_s is not None]
    waits = [r.waited_s for r in waited if r.waited_s is not None]
    # how far the first estimate shown was from the wait that followed it (0.5: half the wait too long or too short)
    told = [(r.expected_wait_s, r.estimated_wait_s) for r in waited if r.expected_wait_s is not None]
    off = [abs(expected - (wait or 0)) / max(wait or 0, 1.0) for expected, wait in told]
    after = [r.after_admission_s for r in replies if r.after_admission_s is not None]
    return {
        "first_text_after_admission_s": (
            {"p50": round(percentile(after, 50), 3), "p90": round(percentile(after, 90), 3)} if after else None
        ),
        "waited": len(waited),
        "waited_without_estimate": len(waited) - len(told),  # their turn came before the line had moved enough
        "wait_s": {"p50": round(percentile(waits, 50), 2), "p90": round(percentile(waits, 90), 2), "max": max(waits)}
        if waits
        else None,
        "told_busy": sum(r.told_busy for r in replies),
        "told_late": sum(r.told_late for r in replies),
        "estimate_off": {"p50": round(percentile(off, 50), 2), "p90": round(percentile(off, 90), 2)} if off else None,
        "estimates_within_half": round(sum(o <= 0.5 for o in off) / len(off), 2) if off else None,
    }


def api_summary(calls: list[ApiCall]) -> dict[str, Any]:
    """The API clients' requests: answered, told to come back (503 or 429 with Retry-After), failed otherwise."""
    later = [c for c in calls if c.status in (429, 503)]
    return {
        "requests": len(calls),
        "ok": sum(c.status == 200 and not c.error for c in calls),
        "told_busy": len(later),
        "retry_after_s": sorted({c.retry_after_s for c in later if c.retry_after_s is not None})[:10],
        "failed": sorted({f"{c.status} {c.error}"[:120] for c in calls if c.status not in (200, 429, 503) or c.error}),
    }


async def api_client(index: int, url: str, deadline: float, max_tokens: int, report: Report) -> None:
    """One tool calling the app's API in a loop until the deadline (streamed replies); told to come back, it waits
    as long as Retry-After says, as the official OpenAI clients do."""
    import httpx

    body = {"model": "auto", "stream": True, "max_tokens": max_tokens}
    async with httpx.AsyncClient(base_url=url, timeout=600, trust_env=False) as http:
        turn = 0
        while time.monotonic() < deadline:
            prompt = PROMPTS[(index + turn) % len(PROMPTS)]
            turn += 1
            started = time.monotonic()
            call = ApiCall(index, 0, 0.0)
            try:
                messages = [{"role": "user", "content": prompt}]
                async with http.stream("POST", "/v1/chat/completions", json={**body, "messages": messages}) as resp:
                    call.status = resp.status_code
                    if resp.status_code == 200:
                        async for line in resp.aiter_lines():
                            if line.startswith("data: {") and '"error"' in line[:20]:
                                call.error = line[6:200]
                            call.chars += len(line)
                    else:
                        await resp.aread()
                        call.retry_after_s = float(resp.headers.get("retry-after", 0)) or None
            except httpx.HTTPError as exc:
                call.error = f"{type(exc).__name__}: {exc}"
            call.seconds = time.monotonic() - started
            report.api.append(call)
            if call.retry_after_s:
                await asyncio.sleep(min(call.retry_after_s, max(0.0, deadline - time.monotonic())))


async def sample_pages(url: str, report: Report, stop: asyncio.Event, every_s: float = 5.0) -> None:
    """A new page's load time (its HTML and the chat's socket connected), every `every_s` seconds."""
    import httpx

    started = time.monotonic()
    async with httpx.AsyncClient(timeout=60, trust_env=False) as http:
        while not stop.is_set():
            begin = time.monotonic()
            try:
                (await http.get(url + "/")).raise_for_status()
                chat = ChatSocket(url, None)
                await chat.connect()
                await chat.close()
                report.pages.append({"t_s": round(begin - started, 1), "seconds": round(time.monotonic() - begin, 3)})
            except Exception as exc:  # a page that does not load is a finding, recorded as a very slow one
                log.warning("A new page did not load: %s", exc)
                report.pages.append({"t_s": round(begin - started, 1), "seconds": float("inf")})
            try:
                await asyncio.wait_for(stop.wait(), every_s)
            except TimeoutError:
                pass


def tree_rss_mib(pid: int) -> float:
    """Resident memory of a process and all its descendants, in MiB."""
    return tree_rss_bytes(pid) / 2**20


def last_text_at(events: list[tuple[str, Any]], times: list[float], start: int, end: int) -> float | None:
    """When the page got the reply's last text between events `start` and `end` (its last stream_token, or the
    stream_start that carried it all)."""
    for i in reversed(range(start, end)):
        if events[i][0] in ("stream_token", "stream_start"):
            return times[i]
    return None


def first_text_at(events: list[tuple[str, Any]], times: list[float], start: int, end: int) -> float | None:
    """When the page got the reply's first text between events `start` and `end`: the reply's `stream_start`
    (Chainlit sends the first piece with it; an app notice is never streamed, but is left out all the same)."""
    for i in range(start, end):
        event, data = events[i]
        if event == "stream_start" and not (isinstance(data, dict) and data.get("name") == "system"):
            return times[i]
    return None


async def open_chat(url: str, max_tokens: int) -> ChatSocket:
    """A new chat, started (on_chat_start ran) with the reply length set (acknowledged once applied)."""
    chat = ChatSocket(url, None)
    await chat.connect()
    await chat.change_settings({"max_tokens": max_tokens})
    return chat


def _text_pattern(text: str) -> re.Pattern[str]:
    """A catalogue text as a pattern, each parameter a captured number."""
    return re.compile(re.sub(r"\\{\w+(?::[^}]*)?\\}", r"(\\d+)", re.escape(text)))


def _pattern(key: str, lang: str = "en") -> re.Pattern[str]:
    """A chat text (backend.chat.i18n.MESSAGES) as a pattern, each parameter a captured number."""
    return _text_pattern(MESSAGES[key][lang])


QUEUED, QUEUE_DONE, QUEUED_LATE = _pattern("queued"), _pattern("queue_done"), _pattern("queued_late")
IN_LINE = re.compile(f"{QUEUED.pattern}|{_pattern('queued_measuring').pattern}")  # the first notice of a place
# A reply's end is awaited this long: a message may wait in line up to the app's bound (admission.max_wait_s, 180 s
# by default, longer where the line moved slower than expected: the page is then told so) before its reply begins.
REPLY_WAIT_S = 600
BUSY = re.compile(re.escape(CATALOG["admission.full"].en[0].split("(")[0].strip()))
RETRY = _text_pattern(CATALOG["admission.full"].en[1])


def notice_seen(
    events: list[tuple[str, Any]], times: list[float], start: int, end: int, pattern: re.Pattern[str]
) -> tuple[re.Match[str], float] | None:
    """The first app notice between events `start` and `end` that matches `pattern`, and when it came."""
    for i in range(start, end):
        event, data = events[i]
        if event in ("new_message", "update_message") and isinstance(data, dict) and data.get("name") == "system":
            if found := pattern.search(str(data.get("output", ""))):
                return found, times[i]
    return None


async def ask(chat: ChatSocket, index: int, turn: int, text: str) -> Reply:
    """Send `text` in `chat`, read the reply to its end; what the page saw, timed from the send."""
    start, started = len(chat.events), time.monotonic()
    await chat.send(text)
    taken = await chat.wait_for("task_start", start)
    end = await chat.wait_for("task_end", taken, REPLY_WAIT_S)
    first = first_text_at(chat.events, chat.times, start, end)
    last = last_text_at(chat.events, chat.times, start, end)
    steps = chat.reply_steps(start)
    # Finished: the reply's details in its metadata and its text alone (not the model's words: a
    # stopped, interrupted or failed reply has an ending line, a reply with no text shows none).
    ok = bool(steps) and reply_finished(steps[-1])
    output = str(steps[-1].get("output", "")) if steps else ""
    problem = "" if ok else (output[-200:] or " / ".join(chat.notices(start))[-200:] or "no reply")
    seconds = chat.times[end] - started
    details = ((steps[-1].get("metadata") or {}).get(DETAILS_KEY) or {}) if ok else {}
    line = notice_seen(chat.events, chat.times, start, end, IN_LINE)
    estimate = notice_seen(chat.events, chat.times, start, end, QUEUED)
    turn_came = notice_seen(chat.events, chat.times, start, end, QUEUE_DONE)
    notices = chat.notices(start)
    busy = any(BUSY.search(notice) for notice in notices)
    retry = next((float(found.group(1)) for notice in notices if (found := RETRY.search(notice))), None)
    late = notice_seen(chat.events, chat.times, start, end, QUEUED_LATE) is not None
    return Reply(
        index, ok, seconds, None if first is None else first - started, len(output), problem, turn,
        details.get("ttft_s"), details.get("prompt_tokens"), chat.times[taken] - started,
        None if last is None else chat.times[end] - last,
        int(next(g for g in line[0].groups() if g)) if line else None,
        float(estimate[0].group(2)) if estimate else None,
        (first - line[1]) if line and first is not None else None,
        (first - estimate[1]) if estimate and first is not None else None, busy,
        (first - turn_came[1]) if turn_came and first is not None else None, late, retry if busy else None,
    )  # fmt: skip


async def one_session(
    index: int, url: str, deadline: float, max_tokens: int, report: Report, chats: str = "growing"
) -> None:
    """One session's messages until the deadline: in one growing chat, or each in a fresh chat."""
    chat: ChatSocket | None = None
    try:
        turn = 0
        while time.monotonic() < deadline:
            if chat is None:
                chat = await open_chat(url, max_tokens)
            text = PROMPTS[(index + turn) % len(PROMPTS)]
            reply = await ask(chat, index, turn if chats == "growing" else 0, text)
            report.replies.append(reply)
            turn += 1
            if reply.told_busy:  # as a person would: again when the page said to (the API clients do the same)
                await asyncio.sleep(min(reply.retry_after_s or 5.0, max(0.0, deadline - time.monotonic())))
            if chats == "fresh":
                await chat.close()
                chat = None
    except Exception as exc:  # a dropped connection or a timeout is a failed reply, reported
        report.replies.append(Reply(index, False, 0.0, None, 0, f"{type(exc).__name__}: {exc}"))
    finally:
        if chat is not None:
            await chat.close()


async def sample_memory(app_pid: int, engine_pid: int, report: Report, stop: asyncio.Event) -> None:
    started = time.monotonic()
    while not stop.is_set():
        report.memory.append(
            {
                "t_s": round(time.monotonic() - started, 1),
                "app_mib": tree_rss_mib(app_pid) - tree_rss_mib(engine_pid),
                "engine_mib": tree_rss_mib(engine_pid),
            }
        )
        try:
            await asyncio.wait_for(stop.wait(), 2.0)
        except TimeoutError:
            pass


async def run(
    url: str,
    sessions: int,
    duration_s: float,
    max_tokens: int,
    app_pid: int | None,
    chats: str = "growing",
    api_clients: int = 0,
) -> Report:
    """`sessions` sessions at once for `duration_s` seconds, in chats of the kind `chats` (CHATS), beside
    `api_clients` tools calling the API; a new page's load time sampled throughout."""
    import httpx

    if chats not in CHATS:
        raise ValueError(f"chats: one of {', '.join(CHATS)}, not {chats!r}")
    async with httpx.AsyncClient(trust_env=False) as http:
        health = (await http.get(url + "/healthz", timeout=10)).json()
    report = Report(sessions, duration_s, chats)
    stop = asyncio.Event()
    sampler = None
    if app_pid:
        sampler = asyncio.create_task(sample_memory(app_pid, health["engine"]["pid"], report, stop))
    pages = asyncio.create_task(sample_pages(url, report, stop))
    deadline = time.monotonic() + duration_s
    await asyncio.gather(
        *(one_session(i, url, deadline, max_tokens, report, chats) for i in range(sessions)),
        *(api_client(i, url, deadline, max_tokens, report) for i in range(api_clients)),
    )
    stop.set()
    await pages
    if sampler:
        await sampler
    return report


def loadtest_command(
    url: str,
    sessions: list[int],
    duration_s: float,
    max_tokens: int,
    app_pid: int | None,
    out: Path,
    chats: list[str] | None = None,
    api_clients: int = 0,
) -> int:
    """`loadtest`: each kind of chat at each session count in turn; write <out>/load.json (one entry a level),
    print the summaries; 1 when a reply failed or a level got none."""
    levels: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    out.mkdir(parents=True, exist_ok=True)
    for kind in chats or ["growing"]:
        for count in sessions:
            report = asyncio.run(run(url, count, duration_s, max_tokens, app_pid, kind, api_clients))
            summaries.append(summary := report.summary())
            levels.append(
                {
                    "summary": summary,
                    "replies": [asdict(r) for r in report.replies],
                    "memory": report.memory,
                    "api": [asdict(c) for c in report.api],
                    "pages": report.pages,
                }
            )
            print(json.dumps(summary, indent=2, ensure_ascii=False), flush=True)
            # written after each run: a later one that breaks leaves the earlier ones on disk
            (out / "load.json").write_text(json.dumps({"levels": levels}, indent=2, ensure_ascii=False))
    # A message told the server is busy got its clear answer: not a failed reply.
    return 0 if all(lost(s) == 0 and s["replies_ok"] > 0 for s in summaries) else 1


def lost(summary: dict[str, Any]) -> int:
    """Replies that failed other than by a clear "busy, come back in N s"."""
    return int(summary["replies_failed"]) - int(summary["line"]["told_busy"])
