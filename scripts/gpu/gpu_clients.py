"""Issue 43, item 1: is the first token's time outside vLLM's own count spent in vLLM's API server or in the one
client process that measures 16 users at once?

usage: python scripts/gpu/gpu_clients.py OUT_DIR MODEL_DIR   (run by `bash scripts/gpu/gpu_run.sh clients`)

One engine as the app starts it (its supervisor, profile h200, bf16, vLLM's dummy weights of the folder's
architecture: speed only), alone on the GPU. The same load two ways, CLIENTS_ROUNDS rounds (5) alternated (order
reversed each round): 64 prompts of 512 tokens sent as token ids to /v1/completions (vLLM neither renders nor
tokenizes), 256 output tokens, greedy, 16 at once,
- "one process": 16 streams on one asyncio event loop in this process (how gpu_price.py measured, and how the app
  serves its users);
- "16 processes": 16 client processes of their own, each sending its 4 prompts one after another, started together.
Per way and round: the client's TTFT P50/P99/mean and vLLM's own TTFT mean (its /metrics histograms before and after),
so "client minus vLLM's" says what the client side adds. Written to OUT_DIR/clients.json as measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpu_metrics import machine, metrics_delta, out_and_model, scrape
from gpu_price import INPUT_LEN, OUTPUT_LEN, SAMPLING, Engine, IdsSender, Prompts, brief

from backend.benchmarks.loadgen import run_level
from backend.benchmarks.stats import RequestResult, level_metrics, spread
from backend.benchmarks.workload import BenchRequest

ROUNDS = int(os.environ.get("CLIENTS_ROUNDS", "5"))
USERS, REQUESTS = 16, 64
WAYS = ("one process", "16 processes")
# A client process of its own: its prompts (token ids) from stdin, sent one after another from START_AT on; prints
# each request's TTFT and latency (seconds) as JSON. Only httpx, so that it starts quickly.
WORKER = r"""
import json, sys, time, httpx
job = json.load(sys.stdin)
out = []
with httpx.Client(timeout=600, trust_env=False) as http:
    while time.time() < job["start_at"]:
        time.sleep(0.001)
    for ids in job["prompts"]:
        body = {"model": job["model"], "prompt": ids, "stream": True, **job["sampling"]}
        start = time.perf_counter(); first = None
        with http.stream("POST", job["url"], json=body, headers=job["headers"]) as resp:
            for line in resp.iter_lines():
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    data = json.loads(line[5:])
                    if first is None and data.get("choices"):
                        first = time.perf_counter() - start
        out.append({"ttft": first, "latency": time.perf_counter() - start, "end": time.time()})
print(json.dumps(out))
"""


async def processes(svc: Engine, prompts: list[list[int]]) -> tuple[list[RequestResult], float]:
    """The prompts over USERS client processes of their own, started together; their results and the wall time."""
    ep, start_at = svc.endpoint, time.time() + 4.0
    base = {"url": ep.base_url + "/v1/completions", "headers": {"Authorization": f"Bearer {ep.api_key}"},
            "model": ep.model, "sampling": SAMPLING.body(OUTPUT_LEN), "start_at": start_at}  # fmt: skip
    procs = []
    for u in range(USERS):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", WORKER, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        job = {**base, "prompts": prompts[u::USERS]}
        procs.append((proc, json.dumps(job).encode()))
    outs = await asyncio.gather(*(p.communicate(data) for p, data in procs))
    results, end = [], start_at
    for stdout, _ in outs:
        for r in json.loads(stdout):
            ok = r["ttft"] is not None
            results.append(RequestResult(ok, ttft=r["ttft"] or 0.0, latency=r["latency"], output_tokens=OUTPUT_LEN))
            end = max(end, r["end"])
    return results, end - start_at


async def one_way(svc: Engine, way: str, prompts: list[list[int]], sender: IdsSender, r: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {svc.endpoint.api_key}"}
    async with httpx.AsyncClient(timeout=10, trust_env=False, headers=headers) as http:
        before = await scrape(http, svc.endpoint.base_url)
        if way == "one process":
            for i, ids in enumerate(prompts):
                sender.ids[f"c{r}-{i}"] = ids
            reqs = [BenchRequest([], OUTPUT_LEN, f"c{r}-{i}") for i in range(len(prompts))]
            results, wall = await run_level(sender, reqs, USERS)
        else:
            results, wall = await processes(svc, prompts)
        out = level_metrics(USERS, results, wall).to_dict()
        out["phases"] = metrics_delta(before, await scrape(http, svc.endpoint.base_url))
    out["way"], out["round"] = way, r
    return out


async def main(out: Path, model: str) -> None:
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (the script's own steps, before anything runs)
    doc: dict[str, Any] = {"machine": machine(), "users": USERS, "requests": REQUESTS, "rounds": []}
    svc = Engine(Path(model), "bf16", load_format="dummy")
    svc.start()
    try:
        t0 = time.monotonic()
        if not await svc.supervisor.wait_ready(420):
            doc["error"] = f"{svc.supervisor.status.error}\n{svc.supervisor.status.log_tail}"
            return
        doc["start_s"] = round(time.monotonic() - t0, 1)
        text = Prompts(Path(model))
        ep = svc.endpoint
        sender = IdsSender(ep.base_url, ep.api_key or "", ep.model, {})
        warm = [text.one(INPUT_LEN)[1] for _ in range(USERS)]
        for way in WAYS:  # each way once unmeasured: connections, imports, the engine's first batches
            await one_way(svc, way, warm, sender, -1)
        for r in range(ROUNDS):
            for way in WAYS if r % 2 == 0 else WAYS[::-1]:
                prompts = [text.one(INPUT_LEN)[1] for _ in range(REQUESTS)]  # new prompts: no prefix cache hits
                level = await one_way(svc, way, prompts, sender, r)
                doc["rounds"].append(level)
                print(f"[clients] r{r} {way}: {brief(level)}", flush=True)
                (out / "clients.json").write_text(json.dumps(doc, indent=1))
        summary: dict[str, Any] = {}
        for way in WAYS:
            got = [x for x in doc["rounds"] if x["way"] == way]
            vllm = [x["phases"]["time_to_first_token_seconds"]["mean_ms"] for x in got]
            summary[way] = {
                "ttft_p50_ms": spread([x["ttft_ms"]["p50"] for x in got]).to_list(1),
                "ttft_p99_ms": spread([x["ttft_ms"]["p99"] for x in got]).to_list(1),
                "ttft_mean_ms": spread([x["ttft_ms"]["mean"] for x in got]).to_list(1),
                "vllm_ttft_mean_ms": spread(vllm).to_list(1),
                "client_minus_vllm_ms": spread(
                    [x["ttft_ms"]["mean"] - v for x, v in zip(got, vllm, strict=True)]
                ).to_list(1),
            }
        doc["summary"] = summary
        print(f"[clients] median (min-max) over {ROUNDS} rounds: {json.dumps(summary)}", flush=True)
        await sender.aclose()
    finally:
        (out / "clients.json").write_text(json.dumps(doc, indent=1))
        log = svc.supervisor.log_path
        await svc.stop()
        if log.exists():
            (out / "engine-clients.log").write_text(log.read_text(errors="replace")[-2_000_000:])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args = out_and_model(parser)
    asyncio.run(main(args.out, args.model))
