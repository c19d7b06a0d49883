"""Issue 43: a fresh start on warm caches, before and after the start-time changes, alternated, on one GPU.

usage: python scripts/gpu/gpu_start.py OUT_DIR MODEL_DIR   (run by `bash scripts/gpu/gpu_run.sh start`)

The engine as the app starts it (its supervisor: backend.serving.launch.make_supervisor; profile START_PROFILE,
default h200; random weights,
`--load-format dummy`), alone on the GPU. A first start fills the caches (torch.compile, Triton, vLLM's model
inspection) and is kept apart; then START_ROUNDS rounds (2) of a fresh start "before" and "after", in the order
A B, B A, ...: each timed from the service's start to ready (the warm-up included), its engine log kept with
milliseconds (vLLM's logging configuration) so the phases can be read: the API server's imports, the engine
configuration, the engine core's start, loading, compiling, CUDA graphs, the server's start, the app's warm-up.

"before" spawns vLLM's engine core process (which imports vLLM again: ~20 s on the lent H100), as vLLM's command line
does unless told otherwise; "after" is the app's start now: the engine core forked from the API server. (The API
server module against the `serve` command, measured before: no difference beyond the spread, results/gpu-h100/start.)
Everything is written to OUT_DIR/start.json as it is measured; each start's log to OUT_DIR/start-N-VARIANT.log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpu_metrics import machine, out_and_model, wait_gpu_free
from gpu_price import ms_logging

from backend.benchmarks.stats import spread
from backend.config import load_config
from backend.serving.launch import make_supervisor

ROUNDS = int(os.environ.get("START_ROUNDS", "2"))
PROFILE = os.environ.get("START_PROFILE", "h200")
DEADLINE = float(os.environ.get("TUNE_DEADLINE", time.time() + 540))
# Log lines that mark a phase of a start (the first line matching each), in the order they come.
MARKS = {
    "api_server_first_log": r"non-default args",
    "engine_config": r"Resolved architecture|Using max model len",
    "engine_core_init": r"Initializing a V1 LLM engine",
    "model_loaded": r"Model loading took",
    "compiled": r"torch.compile took|Directly load|compile range .* from the cache|Loading .* from cache",
    "kv_cache": r"GPU KV cache size",
    "graphs_captured": r"Graph capturing finished",
    "engine_ready": r"init engine .* took",
    "server_started": r"Starting vLLM server",
    "server_ready": r"Application startup complete",
}
STAMP = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})")
doc: dict[str, Any] = {}


def phases(log: str, started: float) -> dict[str, float]:
    """Seconds from the start to the first line of each mark (wall clock: the log's stamps against `started`)."""
    out: dict[str, float] = {}
    year = time.localtime(started).tm_year
    for name, pattern in MARKS.items():
        for line in log.splitlines():
            if re.search(pattern, line) and (m := STAMP.search(line)):
                stamp = time.mktime(time.strptime(f"{year}-{m.group(1)[:14]}", "%Y-%m-%d %H:%M:%S"))
                out[name] = round(stamp + float("0" + m.group(1)[14:]) - started, 2)
                break
    return out


def patch(variant: str) -> None:
    """`before`: the engine core spawned (it imports vLLM again), as vLLM's command line does unless told;
    `after`: the app's start now, the engine core forked from the API server (backend.engines.vllm.Vllm.default_env)."""
    if variant == "before":
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    else:
        os.environ.pop("VLLM_WORKER_MULTIPROC_METHOD", None)


async def one(model: str, variant: str, index: int, out: Path) -> dict[str, Any]:
    patch(variant)
    env = {
        **os.environ,
        "ERNIE_ENGINE__NAME": "vllm",
        "ERNIE_ENGINE__PYTHON": sys.executable,
        "ERNIE_ENGINE__PROFILE": PROFILE,
        "ERNIE_ENGINE__FLAGS__EXTRA_ARGS": json.dumps(["--attention-backend", "TRITON_ATTN"]),
        "ERNIE_MODEL__ID": model,
        "ERNIE_MODEL__LOAD_FORMAT": "dummy",
        "ERNIE_SERVER__PORT": "0",
        "ERNIE_PATHS__DATA_DIR": "/tmp/start/data",
        "ERNIE_PATHS__CACHE_DIR": "/tmp/start/cache",
        "ERNIE_TIMEOUTS__STARTUP_S": "400",
        "ERNIE_RESTART__MAX_ATTEMPTS": "1",
    }
    rec: dict[str, Any] = {"index": index, "variant": variant, "gpu_wait_s": await wait_gpu_free()}
    sup = make_supervisor(load_config(environ=env))  # the app's start without its chat (and its ~0.2 s warm-up)
    log = sup.log_path
    mark = log.stat().st_size if log.exists() else 0
    started = time.time()
    t0 = time.monotonic()
    sup.start_background()
    try:
        rec["ready"] = await sup.wait_ready(400)
        rec["ready_s"] = round(time.monotonic() - t0, 2)
        rec["argv"] = sup.spec.argv if sup.spec else None
        if not rec["ready"]:
            rec["error"] = f"{sup.status.error}\n{sup.status.log_tail}"
    finally:
        await sup.stop()
    text = log.read_text(errors="replace")[mark:] if log.exists() else ""
    rec["phases"] = phases(text, started)
    (out / f"start-{index}-{variant}.log").write_text(text[-3_000_000:])
    print(f"[start] #{index} {variant}: ready {rec.get('ready')} in {rec.get('ready_s')} s, phases {rec['phases']}",
          flush=True)  # fmt: skip
    return rec


async def main(out: Path, model: str) -> None:
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (the script's own steps, before anything runs)
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(ms_logging(Path("/tmp/start-logging.json")))
    doc["machine"] = machine()
    doc["profile"] = PROFILE
    doc["starts"] = [await one(model, "after", 0, out)]  # cold: fills the caches
    doc["starts"][0]["cold"] = True
    (out / "start.json").write_text(json.dumps(doc, indent=1))
    order = [v for r in range(ROUNDS) for v in (("before", "after") if r % 2 == 0 else ("after", "before"))]
    longest = doc["starts"][0]["ready_s"]
    for index, variant in enumerate(order, start=1):
        if DEADLINE - time.time() < min(longest, 120) + 20:
            print(f"[start] #{index} {variant}: skipped, {DEADLINE - time.time():.0f} s left", flush=True)
            break
        rec = await one(model, variant, index, out)
        doc["starts"].append(rec)
        (out / "start.json").write_text(json.dumps(doc, indent=1))
    summary: dict[str, Any] = {}
    for variant in ("before", "after"):
        got = [s["ready_s"] for s in doc["starts"] if s["variant"] == variant and not s.get("cold") and s.get("ready")]
        if got:
            summary[variant] = spread(got).to_list(1)  # [median, min, max]
    doc["summary"] = summary
    (out / "start.json").write_text(json.dumps(doc, indent=1))
    print(f"[start] fresh start on warm caches, ready s (median, min, max): {summary}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args = out_and_model(parser)
    asyncio.run(main(args.out, args.model))
