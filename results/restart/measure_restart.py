"""How soon does the chat serve again after the app restarts? An engine kept running and adopted (engine.keep_running,
backend/serving/kept.py) against a fresh start on warm caches (issue 26), alternated.

    .venv/bin/python results/restart/measure_restart.py [--rounds 3] [--replies 10] [--out results/restart/cpu]

All starts share one data and cache folder and run with engine.keep_running on, the way the app does
(ChatService.from_config with the environment's ERNIE_* settings). A first start (cold: it fills the compile caches)
is kept apart. Then each round has an "adopt" start (the engine the previous start kept is adopted) and a "fresh"
start (the kept engine is stopped first, untimed, so the start launches the engine again on the caches the earlier
starts filled), in alternating order. Timed per start: from the service's start to ready (the warm-up included), and
`--replies` first messages of fresh chats to their first text through the chat's own path. The engine left running
at the end is stopped.

Writes results.json and report.md under --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "first-reply"))  # its start, measured the same way
from measure_first_reply import figure, one_start

from backend.config import ROOT, load_config
from backend.serving.hardware import cpu_model
from backend.serving.kept import stop_command

KEEP = {"ERNIE_ENGINE__KEEP_RUNNING": "true"}


def stop_kept(work: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k.startswith("ERNIE_")}
    stop_command(load_config(environ={**env, "ERNIE_PATHS__DATA_DIR": str(work)}))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replies", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "restart" / "cpu")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(tempfile.mkdtemp(prefix="restart-"))
    load = [round(x, 2) for x in os.getloadavg()]
    runs: list[dict[str, Any]] = []
    try:
        cold = await one_start(True, args.replies, work, **KEEP)
        print(json.dumps({"cold": cold}), flush=True)
        for r in range(args.rounds):
            for mode in ("adopt", "fresh") if r % 2 == 0 else ("fresh", "adopt"):
                if mode == "fresh":
                    await asyncio.to_thread(stop_kept, work)
                run = await one_start(True, args.replies, work, **KEEP)
                if run["adopted"] != (mode == "adopt"):
                    raise SystemExit(f"round {r + 1} {mode}: adopted is {run['adopted']}")
                run.update(mode=mode, round=r + 1)
                print(json.dumps(run), flush=True)
                runs.append(run)
    finally:
        await asyncio.to_thread(stop_kept, work)
    summary = {}
    for mode in ("adopt", "fresh"):
        mine = [run for run in runs if run["mode"] == mode]
        summary[mode] = {
            "ready_s": figure([run["ready_s"] for run in mine]),
            "warmup_s": figure([run["warmup_s"] or 0.0 for run in mine]),
            "first_ms": figure([run["first_ms"] for run in mine]),
            "later_median_ms": figure([run["later_median_ms"] for run in mine]),
        }
    meta = {"cpu": cpu_model(), "cores": os.cpu_count(), "created": time.strftime("%Y-%m-%d %H:%M %Z"),
            "engine": cold["engine"], "rounds": args.rounds, "replies": args.replies, "load_start": load,
            "load_end": [round(x, 2) for x in os.getloadavg()], "command": " ".join(sys.argv)}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": runs, "cold": cold},
                                                      indent=1))  # fmt: skip

    def cell(c: dict[str, float], digits: int) -> str:
        return f"{c['median']:.{digits}f} ({c['min']:.{digits}f}-{c['max']:.{digits}f})"

    lines = [
        "# Serving again after a restart: the kept engine adopted, or started afresh on warm caches",
        "",
        f"CPU: {meta['cpu']}, {meta['cores']} cores; {meta['created']}; engine {meta['engine']}. A cold first start, "
        f"then {args.rounds} rounds of adopt and fresh alternated, {args.replies} first messages of fresh chats per "
        f"start through the chat's own path. Load average {load} at the start, {meta['load_end']} at the end. "
        "Cells: median over the rounds (min-max).",
        "",
        "| start | ready after s | of which warm-up s | first reply ms | later replies ms (median) |",
        "|---|---|---|---|---|",
        f"| cold (first) | {cold['ready_s']:.2f} | {cold['warmup_s'] or 0:.2f} | {cold['first_ms']:.1f} | "
        f"{cold['later_median_ms']:.1f} |",
    ]
    for mode, row in summary.items():
        lines.append(f"| {mode} | {cell(row['ready_s'], 2)} | {cell(row['warmup_s'], 2)} | {cell(row['first_ms'], 1)} "
                     f"| {cell(row['later_median_ms'], 1)} |")  # fmt: skip
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    asyncio.run(main())
