"""The daily baseline: `python -m backend bench --snapshot` measures the running app's engine with a short fixed
workload and appends one line to <data_dir>/bench-history.jsonl, then redraws the trend next to it.

One line: time, commit, engine, device, and per level (1 and 4 users) output tok/s, TTFT P50 and TPOT P50 (each
the median of three alternated rounds), and the engine's peak memory. The doctor compares the newest line with
the median of the ones before it (`regression`), so a slower build or machine shows up without anyone reading
plots.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from backend.benchmarks.report import write_report
from backend.benchmarks.run import check_options, run
from backend.config import ROOT, AppConfig
from backend.errors import BenchmarkError, ServiceError
from backend.ops.baseline_history import history_file, read_history, regression
from backend.serving.hardware import cpu_model, detect_gpus
from backend.serving.state_file import read_key, read_state

# The fixed workload: small enough for a CPU (a few minutes on 2 cores), the same every day; three rounds,
# so that one slow moment moves the range, not the day's median.
WORKLOAD: dict[str, Any] = {
    "concurrency": "1,4",
    "requests": 32,
    "repeat": 3,
    "datasets": "synthetic",
    "input_len": 256,
    "output_len": 64,
    "app_concurrency": "none",
    "no_baseline": True,
    "temperature": 0.0,
    "warmup": 2,
    "no_ignore_eos": False,
}
LEVELS = (1, 4)


def snapshot_options(cfg: AppConfig, args: argparse.Namespace) -> argparse.Namespace:
    """`args` set to the fixed workload against the engine the app runs now (from its state file)."""
    state, key = read_state(cfg), read_key(cfg)
    if not state.get("base_url") or key is None:
        raise BenchmarkError(
            f"No running engine is recorded in {cfg.paths.engine_state}.",
            "Start the app (make run) and let its engine become ready, then run the snapshot again.",
        )
    for name, value in WORKLOAD.items():
        setattr(args, name, value)
    args.base_url, args.api_key, args.model = state["base_url"], key, state.get("served_name")
    args.name = args.name or time.strftime("snapshot-%Y%m%d-%H%M%S")
    args.out_dir = args.out_dir or cfg.paths.data / "snapshots" / args.name
    return args


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() or None


def _device() -> str:
    gpus = detect_gpus()
    if gpus:
        return ", ".join(gpu.name for gpu in gpus)
    return cpu_model()


def history_line(doc: dict[str, Any], engine: str) -> dict[str, Any]:
    """The one line a snapshot adds, from the benchmark's run document."""
    levels: dict[str, dict[str, float | None]] = {}
    peak = 0
    for measured in doc["runs"]:
        if measured["target"] != "server":
            continue
        for level in measured["levels"]:
            levels[str(level["concurrency"])] = {
                "tok_s": round(level["output_tokens_per_s"], 1),
                "ttft_p50_ms": (level.get("ttft_ms") or {}).get("p50"),
                "tpot_p50_ms": (level.get("tpot_ms") or {}).get("p50"),
            }
            peak = max(peak, level.get("peak_memory_bytes") or 0)
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": _commit(),
        "engine": engine,
        "device": _device(),
        "levels": levels,
        "peak_memory_mib": round(peak / 2**20) if peak else None,
    }


def append(cfg: AppConfig, line: dict[str, Any]) -> Path:
    path = history_file(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(line, ensure_ascii=False) + "\n")
    return path


def draw_trend(cfg: AppConfig, history: list[dict[str, Any]]) -> Path | None:
    """bench-history.png: tok/s per level over the snapshots (None without matplotlib)."""
    try:
        from matplotlib.figure import Figure  # an optional plotting library, not part of this project
    except ImportError:
        return None
    fig = Figure(figsize=(8, 3.5))
    ax = fig.subplots()
    for level in LEVELS:
        points = [
            (i, line["levels"][str(level)]["tok_s"])
            for i, line in enumerate(history)
            if str(level) in (line.get("levels") or {})
        ]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{level} user(s)")
    ax.set_xlabel("snapshot")
    ax.set_ylabel("output tok/s")
    ax.set_title("Daily baseline (python -m backend bench --snapshot)")
    ax.legend()
    path = history_file(cfg).with_suffix(".png")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path


def snapshot_command(cfg: AppConfig, args: argparse.Namespace, argv: list[str], python: str) -> int:
    """`bench --snapshot`: measure the running engine with the fixed workload; add a line; redraw the trend."""
    try:
        args = check_options(snapshot_options(cfg, args))
        doc = asyncio.run(run(cfg, args, argv, python))
    except ServiceError as exc:
        print(f"bench --snapshot: {exc.message}\n{exc.hint}".rstrip(), file=sys.stderr)
        return 1
    write_report(doc, Path(args.out_dir))
    line = history_line(doc, str(read_state(cfg).get("engine", doc["server"]["engine"])))
    path = append(cfg, line)
    history = read_history(cfg)
    plot = draw_trend(cfg, history)
    print(json.dumps(line, ensure_ascii=False))
    print(f"appended to {path}" + (f"; trend in {plot}" if plot else ""))
    found = regression(history)
    if found:
        print(f"regression: {found}", file=sys.stderr)
    return 0
