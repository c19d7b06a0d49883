"""The app's own streaming path against the engine on a GPU: one engine alone (vLLM defaults), each level measured
straight at the server and then through the app's ChatClient, repeated in rounds (server, app, server, app ...).

usage: python scripts/gpu/gpu_app_path.py OUT_DIR MODEL_DIR [ROUNDS]   (run by scripts/gpu/gpu_run.sh with TUNE_SCRIPT)

Per round and level: output tok/s and TTFT P50 of both paths and the client process's CPU time. The ratio app /
server at 64 users and the TTFT difference at one user are what issue 17 asks to bring within 5 % and 2 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpu_tune import BENCH, OUTPUT_LEN, WARMUP, bench_level, gpu_state, machine, service, wait_gpu_free

from backend.benchmarks.run import check_options, run
from backend.benchmarks.stats import spread
from backend.chat.service import ChatService
from backend.cli import build_parser
from backend.config import load_config
from backend.engines.base import engine_python

LEVELS = [(1, 32), (64, 256)]
if os.environ.get("TUNE_SMOKE"):  # a quick check of this script on a CPU (see scripts/gpu/gpu_tune.py)
    LEVELS = [(1, 3), (4, 8)]


async def both_paths(svc: ChatService, users: int, requests: int, seed: int) -> dict[str, Any]:
    """One level at the server, then the same requests through the app's client (the tool's app run)."""
    ep = svc.endpoint
    bench = [a for a in BENCH if a not in ("--app-concurrency", "none")]
    argv = [
        "--base-url", ep.base_url + "/v1", "--api-key", ep.api_key, "--model", ep.model,
        "--concurrency", str(users), "--requests", str(requests), "--seed", str(seed), "--warmup", "0",
        "--name", f"c{users}", "--out-dir", "/tmp/tune/unused", *bench, "--app-concurrency", str(users),
        "--output-len", str(OUTPUT_LEN),
    ]  # fmt: skip
    cfg = load_config()
    c0 = os.times()
    doc = await run(cfg, check_options(build_parser().parse_args(["bench", *argv])), argv, engine_python(cfg))
    c1 = os.times()
    got: dict[str, Any] = {"client_cpu_s": round((c1.user - c0.user) + (c1.system - c0.system), 2)}
    for r in doc["runs"]:
        level = r["levels"][0]
        got[r["target"]] = {
            "tok_s": round(level["output_tokens_per_s"], 1),
            "ttft_p50_ms": level["ttft_ms"]["p50"],
            "ttft_p99_ms": level["ttft_ms"]["p99"],
            "errors": level["errors"],
        }
    return got


async def main(out: Path, model: str, rounds: int) -> None:
    doc: dict[str, Any] = {"machine": machine(), "config": "defaults", "rounds": []}
    await wait_gpu_free()
    svc = service(model, "defaults", "app-path", 0)
    t0 = time.monotonic()
    svc.start()
    try:
        if not await svc.supervisor.wait_ready(300):
            doc["error"] = f"{svc.supervisor.status.error}\n{svc.supervisor.status.log_tail}"
            return
        doc["start_s"] = round(time.monotonic() - t0, 1)
        for k, (users, n, out_len) in enumerate(WARMUP):
            await bench_level(svc, users, n, out_len, seed=90_000 + k)
        for round_no in range(rounds):
            entry: dict[str, Any] = {"round": round_no + 1}
            for users, n in LEVELS:
                entry[str(users)] = await both_paths(svc, users, n, seed=1000 * round_no + users)
                print(f"[app-path] round {round_no + 1} c={users}: {json.dumps(entry[str(users)])}", flush=True)
            entry["gpu"] = gpu_state()
            doc["rounds"].append(entry)
            (out / "app-path.json").write_text(json.dumps(doc, indent=1))
    finally:
        await svc.stop()
    summary: dict[str, Any] = {}
    for users, _ in LEVELS:
        ratios = [r[str(users)]["app"]["tok_s"] / r[str(users)]["server"]["tok_s"] for r in doc["rounds"]]
        gaps = [r[str(users)]["app"]["ttft_p50_ms"] - r[str(users)]["server"]["ttft_p50_ms"] for r in doc["rounds"]]
        summary[str(users)] = {
            "app_over_server_tok_s": spread(ratios).to_list(3),  # [median, min, max]
            "ttft_p50_gap_ms": spread(gaps).to_list(2),
        }
    doc["summary"] = summary
    (out / "app-path.json").write_text(json.dumps(doc, indent=1))
    print("[app-path] summary (median, min, max):", json.dumps(summary), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the results folder (created)")
    parser.add_argument("model", help="the model folder (random weights are loaded: --load-format dummy)")
    parser.add_argument("rounds", type=int, nargs="?", default=3, help="server, app, server, app ... (default 3)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    asyncio.run(main(args.out, args.model, args.rounds))
