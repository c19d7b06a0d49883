"""Many chat sessions at once through the app's real Chainlit websocket (Socket.IO), as browsers would.

    python -m backend loadtest --url http://127.0.0.1:8501 --sessions 64 --duration 120 --out results/load

Each session connects like the web page, sends a message, reads the streamed reply to its end, and
repeats until the time is up (a reply under way is finished). It reports completed and failed
replies, latency percentiles, and the memory (RSS) of the app and its engine sampled over time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from backend.benchmarks.chat_socket import ChatSocket, reply_finished
from backend.benchmarks.memory import tree_rss_bytes

log = logging.getLogger(__name__)

PROMPTS = [
    "你好，请介绍一下你自己。",
    "What is the capital of France?",
    "Give me one tip for sleeping better.",
    "用一句话解释什么是人工智能。",
]


@dataclass
class Reply:
    session: int
    ok: bool
    seconds: float
    ttft_s: float | None
    chars: int
    error: str = ""


@dataclass
class Report:
    sessions: int
    duration_s: float
    replies: list[Reply] = field(default_factory=list)
    memory: list[dict[str, float]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        done = [r for r in self.replies if r.ok]
        lat = sorted(r.seconds for r in done)
        ttft = sorted(r.ttft_s for r in done if r.ttft_s is not None)

        def pct(values: list[float], p: float) -> float | None:
            return round(values[min(len(values) - 1, int(p / 100 * len(values)))], 3) if values else None

        rss = [m["app_mib"] + m["engine_mib"] for m in self.memory]
        third = max(1, len(rss) // 3)
        return {
            "sessions": self.sessions,
            "duration_s": self.duration_s,
            "replies_ok": len(done),
            "replies_failed": len(self.replies) - len(done),
            "errors": sorted({r.error for r in self.replies if not r.ok}),
            "latency_s": {"p50": pct(lat, 50), "p90": pct(lat, 90), "p99": pct(lat, 99), "max": pct(lat, 100)},
            "ttft_s": {"p50": pct(ttft, 50), "p90": pct(ttft, 90), "p99": pct(ttft, 99)},
            "memory_mib": {
                "first_third_mean": round(statistics.mean(rss[:third]), 1) if rss else None,
                "last_third_mean": round(statistics.mean(rss[-third:]), 1) if rss else None,
                "max": round(max(rss), 1) if rss else None,
            },
        }


def tree_rss_mib(pid: int) -> float:
    """Resident memory of a process and all its descendants, in MiB."""
    return tree_rss_bytes(pid) / 2**20


async def one_session(index: int, url: str, deadline: float, max_tokens: int, report: Report) -> None:
    chat = ChatSocket(url, None)
    try:
        await chat.connect()  # returns once the chat has started (on_chat_start ran)
        await chat.change_settings({"max_tokens": max_tokens})  # acknowledged once applied
        turn = 0
        while time.monotonic() < deadline:
            text = PROMPTS[(index + turn) % len(PROMPTS)]
            turn += 1
            start, started = len(chat.events), time.monotonic()
            await chat.send(text)
            end = await chat.wait_for("task_end", await chat.wait_for("task_start", start))
            first = next((chat.times[i] for i in range(start, end) if chat.events[i][0] == "stream_token"), None)
            steps = chat.reply_steps(start)
            # Finished: the reply's details in its metadata and its text alone (not the model's words: a
            # stopped, interrupted or failed reply has an ending line, a reply with no text shows none).
            ok = bool(steps) and reply_finished(steps[-1])
            output = str(steps[-1].get("output", "")) if steps else ""
            problem = "" if ok else (output[-200:] or " / ".join(chat.notices(start))[-200:] or "no reply")
            report.replies.append(
                Reply(index, ok, chat.times[end] - started, first and first - started, len(output), problem)
            )
    except Exception as exc:  # a dropped connection or a timeout is a failed reply, reported
        report.replies.append(Reply(index, False, 0.0, None, 0, f"{type(exc).__name__}: {exc}"))
    finally:
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


async def run(url: str, sessions: int, duration_s: float, max_tokens: int, app_pid: int | None) -> Report:
    import httpx

    async with httpx.AsyncClient(trust_env=False) as http:
        health = (await http.get(url + "/healthz", timeout=10)).json()
    report = Report(sessions, duration_s)
    stop = asyncio.Event()
    sampler = None
    if app_pid:
        sampler = asyncio.create_task(sample_memory(app_pid, health["engine"]["pid"], report, stop))
    deadline = time.monotonic() + duration_s
    await asyncio.gather(*(one_session(i, url, deadline, max_tokens, report) for i in range(sessions)))
    stop.set()
    if sampler:
        await sampler
    return report


def loadtest_command(
    url: str, sessions: int, duration_s: float, max_tokens: int, app_pid: int | None, out: Path
) -> int:
    """`loadtest`: run the sessions, write <out>/load.json, print the summary; 1 when a reply failed or none came."""
    report = asyncio.run(run(url, sessions, duration_s, max_tokens, app_pid))
    summary = report.summary()
    out.mkdir(parents=True, exist_ok=True)
    (out / "load.json").write_text(
        json.dumps(
            {"summary": summary, "replies": [asdict(r) for r in report.replies], "memory": report.memory},
            indent=2,
            ensure_ascii=False,
        )
    )
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    return 0 if summary["replies_failed"] == 0 and summary["replies_ok"] > 0 else 1
