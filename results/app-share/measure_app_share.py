"""What the app adds to the first text the user sees (issue 26), in fresh chats and in chats that grow to the
context budget, at 1 and 16 sessions: the app started as `make run` starts it (`chainlit run app.py`, the default
configuration, the engine this machine's kept tune chose), driven through its websocket by the load tool
(backend/benchmarks/loadtest.py), which takes each reply's first text where the page gets it (stream_start) and
the engine's part of it from the reply's details (the app's request to the engine's first text).

    .venv/bin/python results/app-share/measure_app_share.py [--rounds 3] [--max-tokens 64] [--out results/app-share/cpu]
        [--levels fresh:1:40,growing:1:90] [--app-dir CHECKOUT] [--python PYTHON]

--python runs the app as `PYTHON -m chainlit run app.py` instead of the checkout's .venv/bin/chainlit (the lent GPU
machine, where the app's packages come on PYTHONPATH: scripts/gpu/gpu_run.sh app-share).

--app-dir starts the app of another checkout (a git worktree of an earlier commit, sharing .venv), for an A/B of
two versions: run this once per version and round, alternating them, each with its own --out.

Each round runs every (chats, sessions) level once, the order reversed from one round to the next (A B B A ...).
Writes results.json (each level's summary and replies per round) and report.md (median and min-max over rounds of
each level's P50/P90/P99) under --out. Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from backend.benchmarks.loadtest import APP_SHARE, FIRST_TEXT, TAIL, Reply, run
from backend.benchmarks.stats import percentile, spread_text
from backend.config import ROOT
from backend.serving.hardware import cpu_model

LEVELS = [("fresh", 1, 40), ("growing", 1, 90), ("fresh", 16, 40), ("growing", 16, 60)]  # chats, sessions, seconds
LONG = 0.75  # a growing chat's "long" replies: a prompt of at least this share of the longest one seen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_app(port: int, data: Path, app_dir: Path, python: str | None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ERNIE_PATHS__DATA_DIR": str(data)}
    log = open(data / "app-console.txt", "wb")  # open for the app's lifetime
    chainlit = [python, "-m", "chainlit"] if python else [str(app_dir / ".venv" / "bin" / "chainlit")]
    cmd = [*chainlit, "run", "app.py", "--headless", "--port", str(port)]
    return subprocess.Popen(cmd, cwd=app_dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(url: str, app: subprocess.Popen[bytes], timeout_s: float = 900) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if app.poll() is not None:
            raise SystemExit(f"the app ended (exit {app.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=5) as r:
                if r.status == 200:
                    return dict(json.load(r))
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"the app was not ready in {timeout_s:.0f} s")


def gpu_name() -> str | None:
    """The GPU's name where there is one (nvidia-smi), for the results beside the CPU's."""
    try:
        query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
        out = subprocess.run(query, capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() or None


def commit_of(checkout: Path) -> str:
    """The checkout's commit, with "+changes" where its tracked files differ from it."""
    git = ["git", "-C", str(checkout)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD"]).returncode != 0
    return head + ("+changes" if dirty else "")


def pct(values: list[float]) -> dict[str, float | None]:
    return {f"p{p}": round(percentile(values, p), 2) if values else None for p in (50, 90, 99)}


def level_figures(replies: list[Reply]) -> dict[str, Any]:
    """The app's share (ms) over all finished replies and over the long ones of a growing chat."""
    done = [r for r in replies if r.ok and r.app_share_s is not None]
    longest = max((r.prompt_tokens or 0 for r in done), default=0)
    long = [r for r in done if (r.prompt_tokens or 0) >= LONG * longest and r.turn > 0]
    return {
        "replies": len(done),
        "first_text_ms": pct([(r.first_text_s or 0) * 1000 for r in done]),
        "engine_first_text_ms": pct([(r.engine_first_text_s or 0) * 1000 for r in done]),
        "app_share_ms": pct([(r.app_share_s or 0) * 1000 for r in done]),
        # the share split where the page hears that Chainlit took the message (task_start, before on_message):
        # Chainlit's way in, then the app's path to the engine and the first piece's way out
        "to_task_start_ms": pct([(r.taken_s or 0) * 1000 for r in done]),
        "after_task_start_ms": pct([((r.app_share_s or 0) - (r.taken_s or 0)) * 1000 for r in done]),
        "tail_ms": pct([r.tail_s * 1000 for r in done if r.tail_s is not None]),  # TAIL
        "prompt_tokens_max": longest,
        "long_replies": len(long),
        "long_prompt_tokens_min": min((r.prompt_tokens or 0 for r in long), default=None),
        "long_app_share_ms": pct([(r.app_share_s or 0) * 1000 for r in long]),
    }


def report(runs: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "| chats | sessions | replies per run | first text P50 ms | engine's P50 ms | app's share P50 ms | P90 | P99 |"
        " long-prompt replies: tokens ≥ | app's share P50 | P99 | tail P50 ms | P90 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for chats, sessions, _ in meta["levels"]:
        mine = [r["figures"] for r in runs if (r["chats"], r["sessions"]) == (chats, sessions)]
        if not mine:
            continue
        row = [
            chats, str(sessions), spread_text([f["replies"] for f in mine]),
            spread_text([f["first_text_ms"]["p50"] for f in mine]),
            spread_text([f["engine_first_text_ms"]["p50"] for f in mine]),
            *(spread_text([f["app_share_ms"][p] for f in mine]) for p in ("p50", "p90", "p99")),
        ]  # fmt: skip
        if chats == "growing":
            row += [
                spread_text([f["long_prompt_tokens_min"] for f in mine]),
                spread_text([f["long_app_share_ms"]["p50"] for f in mine]),
                spread_text([f["long_app_share_ms"]["p99"] for f in mine]),
            ]
        else:
            row += ["", "", ""]
        row += [spread_text([f["tail_ms"]["p50"] for f in mine]), spread_text([f["tail_ms"]["p90"] for f in mine])]
        lines.append("| " + " | ".join(row) + " |")
    gpu = f"; GPU: {meta['gpu']}" if meta.get("gpu") else ""
    head = (
        f"CPU: {meta['cpu']}{gpu}; engine {meta['engine']}; {meta['rounds']} rounds, levels alternated;"
        f" median (min-max) over rounds. First text: {FIRST_TEXT}. App's share: {APP_SHARE}. Tail: {TAIL}.\n\n"
    )
    return head + "\n".join(lines) + "\n"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "app-share" / "cpu")
    parser.add_argument("--levels", default=",".join(f"{c}:{n}:{s}" for c, n, s in LEVELS), help="chats:sessions:s,...")
    parser.add_argument("--app-dir", type=Path, default=ROOT)
    parser.add_argument("--python", help="run the app as PYTHON -m chainlit (default: the checkout's .venv)")
    args = parser.parse_args()
    levels = [(c, int(n), float(s)) for c, n, s in (part.split(":") for part in args.levels.split(","))]
    data = Path(tempfile.mkdtemp(prefix="app-share-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    app = start_app(port, data, args.app_dir.resolve(), args.python)
    runs: list[dict[str, Any]] = []
    try:
        health = wait_ready(url, app)
        meta = {
            "cpu": cpu_model(), "gpu": gpu_name(), "machine": platform.machine(), "cores": os.cpu_count(),
            "load_before": [round(x, 2) for x in os.getloadavg()],
            "engine": f"{health['engine'].get('name')} ({health['engine'].get('model', '')})",
            "health": health, "rounds": args.rounds, "max_tokens": args.max_tokens, "levels": levels,
            "app_dir": str(args.app_dir.resolve()),
            "app_commit": commit_of(args.app_dir),
            "settings": {k: v for k, v in os.environ.items() if k.startswith("ERNIE_")},
        }  # fmt: skip
        print(json.dumps({"ready": meta["engine"], "cpu": meta["cpu"]}), flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        for r in range(args.rounds):
            for chats, sessions, seconds in levels if r % 2 == 0 else list(reversed(levels)):
                got = await run(url, sessions, seconds, args.max_tokens, None, chats)
                figures = level_figures(got.replies)
                runs.append({"round": r, "chats": chats, "sessions": sessions, "figures": figures,
                             "summary": got.summary(), "replies": [asdict(x) for x in got.replies]})  # fmt: skip
                print(json.dumps({"round": r, "chats": chats, "sessions": sessions, **figures}), flush=True)
                (args.out / "results.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
        (args.out / "report.md").write_text(report(runs, meta))
        print(report(runs, meta))
    finally:
        os.killpg(app.pid, signal.SIGTERM)
        app.wait(60)


if __name__ == "__main__":
    asyncio.run(main())
