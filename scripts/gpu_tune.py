"""Engine tuning on a GPU: several configurations started at once through the project's own supervisor
(ChatService.from_config, as the app does), each measured with the project's benchmark tool
(`python -m backend bench` in --base-url mode), then HF transformers on the same prompts.

usage: python scripts/gpu_tune.py OUT_DIR MODEL_DIR [EXPERIMENT ...]

Starting the engines together costs one start-up (~100-150 s) instead of one per configuration; they
are measured one after another, so the GPU runs one benchmark at a time. Each engine gets 20 % of
the GPU's memory (the model is 0.72 GB; 28 GB of KV cache is far more than 64 x 768 tokens need).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.benchmarks.report import write_report
from backend.benchmarks.run import check_options, run
from backend.chat.service import ChatService
from backend.cli import build_parser
from backend.config import load_config
from backend.engines.base import engine_python

# The bundle carries no FlashAttention kernels; a fixed KV cache (8 GiB) per engine lets several share a GPU.
TRITON = ["--attention-backend", "TRITON_ATTN", "--kv-cache-memory-bytes", str(8 * 1024**3)]
EXPERIMENTS: dict[str, tuple[str, list[str]]] = {
    # name: (profile, extra vLLM flags)
    "defaults": ("defaults", []),
    "h200": ("h200", []),
    "h200-async": ("h200", ["--async-scheduling"]),
    "h200-async-si32": ("h200", ["--async-scheduling", "--stream-interval", "32"]),
    "h200-api4": ("h200", ["--api-server-count", "4"]),
    "h200-api4-si16": ("h200", ["--api-server-count", "4", "--stream-interval", "16"]),
    "h200-api4-async": ("h200", ["--api-server-count", "4", "--async-scheduling"]),
}
BENCH = ["--concurrency", "1,16,64", "--input-len", "512", "--output-len", "256", "--datasets", "synthetic"]
BENCH += ["--rounds", "2", "--temperature", "0", "--warmup", "4", "--no-progress"]


def service(out: Path, model: str, name: str) -> ChatService:
    profile, extra = EXPERIMENTS[name]
    env = {
        "ERNIE_ENGINE__NAME": "vllm",
        "ERNIE_ENGINE__PYTHON": sys.executable,
        "ERNIE_ENGINE__PROFILE": profile,
        "ERNIE_ENGINE__FLAGS__GPU_MEMORY_UTILIZATION": "0.2",
        "ERNIE_ENGINE__FLAGS__EXTRA_ARGS": json.dumps(TRITON + extra),
        "ERNIE_MODEL__ID": model,
        "ERNIE_MODEL__LOAD_FORMAT": "dummy",
        "ERNIE_SERVER__PORT": "0",
        "ERNIE_PATHS__DATA_DIR": str(out / name / "engine"),
        "ERNIE_PATHS__CACHE_DIR": str(out / "cache"),
        "ERNIE_TIMEOUTS__STARTUP_S": "480",
        "ERNIE_RESTART__MAX_ATTEMPTS": "1",
    }
    return ChatService.from_config(load_config(environ=env))


async def bench(svc: ChatService, out: Path, name: str, extra: list[str]) -> None:
    argv = [
        "--base-url", svc.endpoint.base_url + "/v1", "--api-key", svc.endpoint.api_key,
        "--model", svc.endpoint.model, "--name", name, "--out-dir", str(out / name), *BENCH, *extra,
    ]  # fmt: skip
    started = time.monotonic()
    cfg = load_config()
    doc = await run(cfg, check_options(build_parser().parse_args(["bench", *argv])), argv, engine_python(cfg))
    doc["server"]["experiment"] = {"profile": EXPERIMENTS[name][0], "extra_args": TRITON + EXPERIMENTS[name][1]}
    write_report(doc, out / name)
    levels = [
        (lv["concurrency"], round(lv["output_tokens_per_s"]), round(lv["ttft_ms"]["p99"], 1))
        for r in doc["runs"] if r["target"] == "server" for lv in r["levels"]
    ]  # fmt: skip
    print(f"[tune] {name}: {time.monotonic() - started:.0f} s; (concurrency, tok/s, TTFT p99 ms) {levels}", flush=True)


async def main(out: Path, model: str, names: list[str]) -> None:
    t0 = time.monotonic()
    services = {name: service(out, model, name) for name in names}
    for svc in services.values():
        svc.start()
    ready = await asyncio.gather(*(s.supervisor.wait_ready(480) for s in services.values()))
    print(
        f"[tune] engines ready after {time.monotonic() - t0:.0f} s: {dict(zip(names, ready, strict=True))}", flush=True
    )
    try:
        for name, svc in services.items():
            if not svc.supervisor.ready:
                print(f"[tune] {name} failed: {svc.supervisor.status.error}\n{svc.supervisor.status.log_tail}")
                continue
            if name == names[-1]:
                # the last one also runs HF transformers on the same prompts, alone on the GPU
                for other in names[:-1]:
                    await services[other].stop()
                await bench(
                    svc, out, name, ["--app-concurrency", "1,64", "--hf-model", model, "--hf-python", sys.executable]
                )
            else:
                await bench(svc, out, name, ["--app-concurrency", "1,64", "--no-baseline"])
    finally:
        await asyncio.gather(*(s.stop() for s in services.values()))
    print(f"[tune] done in {time.monotonic() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("backend.serving.supervisor").setLevel(logging.INFO)
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:] or list(EXPERIMENTS)))
