"""Is the first reply after a start as fast as later ones? The warm-up (issue 26) measured, on or off, alternated.

    .venv/bin/python results/first-reply/measure_first_reply.py [--rounds 3] [--replies 10]
        [--out results/first-reply/cpu]

Each round starts the engine the way the app does (ChatService.from_config: the configured engine and model, the
environment's ERNIE_* settings; on this machine the offline demo model on llama.cpp), once with the warm-up off
(timeouts.warmup_s 0) and once on, in alternating order, and sends `--replies` first messages of fresh chats one after
another through the chat's own path (ChatService.reply: the counts, the template, the one streaming client). Timed:
from the message to its first text (what the page shows first), the start until ready, and the warm-up. The first
reply is compared with the median of the later ones.

Writes results.json and report.md under --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from backend.benchmarks.stats import spread
from backend.chat.service import ChatService
from backend.chat.turn import Done, Text
from backend.config import ROOT, load_config
from backend.serving.hardware import cpu_model

QUESTIONS = [
    "What is the capital of France?", "Name three colours.", "How many days are in a week?",
    "What is two plus two?", "Say hello in Spanish.", "What do bees make?", "What is ice made of?",
    "Which planet do we live on?", "What colour is the sky on a clear day?", "What is the opposite of hot?",
    "How many legs does a spider have?", "What do cows drink?",
]  # fmt: skip


async def one_start(warm: bool, replies: int, work: Path, **settings: str) -> dict[str, Any]:
    """One start of the engine as the app makes it (data folder `work`, ERNIE_* `settings` on top of the
    environment's), `replies` first messages of fresh chats timed to their first text, then the service's stop."""
    env = {k: v for k, v in os.environ.items() if k.startswith("ERNIE_")}
    env.update({"ERNIE_SERVER__PORT": "0", "ERNIE_PATHS__DATA_DIR": str(work), "ERNIE_CHAT__MAX_TOKENS": "16"})
    env.update(settings)
    if not warm:
        env["ERNIE_TIMEOUTS__WARMUP_S"] = "0"
    service = ChatService.from_config(load_config(environ=env))
    started = time.monotonic()
    service.start()
    try:
        if not await service.supervisor.wait_ready(1800):
            raise SystemExit(f"engine not ready: {service.supervisor.status}")
        ready_s = time.monotonic() - started
        first_text_ms = []
        for number in range(replies):
            session = service.new_session()
            sent, first = time.perf_counter(), None
            async for event in service.reply(session, QUESTIONS[number % len(QUESTIONS)]):
                if isinstance(event, Text) and first is None:
                    first = time.perf_counter()
                if isinstance(event, Done) and event.ending != "finished":
                    raise SystemExit(f"reply {number} ended {event.ending}: {event.error}")
            if first is None:
                raise SystemExit(f"reply {number} had no text")
            first_text_ms.append((first - sent) * 1000)
        return {
            "warm_up": warm, "ready_s": round(ready_s, 2), "warmup_s": service.supervisor.status.warmup_s,
            "adopted": service.supervisor.status.adopted,
            "engine": service.supervisor.spec.engine if service.supervisor.spec else None,
            "first_text_ms": [round(x, 2) for x in first_text_ms],
            "first_ms": round(first_text_ms[0], 2), "later_median_ms": round(statistics.median(first_text_ms[1:]), 2),
        }  # fmt: skip
    finally:
        await service.stop()


def figure(values: list[float]) -> dict[str, float]:
    """{median, min, max} over the rounds, to 0.01."""
    return spread(values).to_dict(2)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replies", type=int, default=10)
    parser.add_argument("--prime", action="store_true", help="one start before the rounds, kept apart (a cold start)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "first-reply" / "cpu")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(tempfile.mkdtemp(prefix="first-reply-"))
    load = [round(x, 2) for x in os.getloadavg()]
    runs = []
    prime = None
    if args.prime:  # the first start on a machine compiles what later starts load from the caches: kept apart
        prime = await one_start(True, args.replies, work / "prime")
        print(json.dumps({"prime": prime}), flush=True)
    for r in range(args.rounds):
        for warm in (False, True) if r % 2 == 0 else (True, False):
            run = await one_start(warm, args.replies, work / f"r{r}-{'on' if warm else 'off'}")
            run["round"] = r + 1
            print(json.dumps(run), flush=True)
            runs.append(run)
    summary = {}
    for warm in (False, True):
        mine = [run for run in runs if run["warm_up"] == warm]
        summary["on" if warm else "off"] = {
            "first_ms": figure([run["first_ms"] for run in mine]),
            "later_median_ms": figure([run["later_median_ms"] for run in mine]),
            "first_minus_later_ms": figure([run["first_ms"] - run["later_median_ms"] for run in mine]),
            "ready_s": figure([run["ready_s"] for run in mine]),
            "warmup_s": figure([run["warmup_s"] for run in mine]) if warm else None,
        }
    meta = {"cpu": cpu_model(), "cores": os.cpu_count(), "created": time.strftime("%Y-%m-%d %H:%M %Z"),
            "engine": runs[0]["engine"], "rounds": args.rounds, "replies": args.replies, "load_start": load,
            "load_end": [round(x, 2) for x in os.getloadavg()], "command": " ".join(sys.argv)}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    whole = {"meta": meta, "summary": summary, "runs": runs, "prime": prime}
    (args.out / "results.json").write_text(json.dumps(whole, indent=1))

    def cell(c: dict[str, float] | None, unit: str = "") -> str:
        return "–" if c is None else f"{c['median']:.{2 if unit == 's' else 0}f} ({c['min']:.1f}-{c['max']:.1f})"

    lines = [
        "# The first reply after a start, with and without the warm-up",
        "",
        f"CPU: {meta['cpu']}, {meta['cores']} cores; {meta['created']}; engine {meta['engine']}. {args.rounds} rounds, "
        f"warm-up off and on alternated, {args.replies} first messages of fresh chats per start through the chat's "
        f"own path, time to the first text. Load average {load} at the start, {meta['load_end']} at the end. "
        "Cells: median over the rounds (min-max).",
        "",
        "| warm-up | first reply ms | later replies ms (median) | first - later ms | ready after s | warm-up s |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in summary.items():
        lines.append(
            f"| {name} | {cell(row['first_ms'])} | {cell(row['later_median_ms'])} | "
            f"{cell(row['first_minus_later_ms'])} | {cell(row['ready_s'], 's')} | {cell(row['warmup_s'], 's')} |"
        )
    if prime is not None:
        lines += ["", f"The first start (warm-up on, kept apart): ready after {prime['ready_s']:.1f} s."]
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    asyncio.run(main())
