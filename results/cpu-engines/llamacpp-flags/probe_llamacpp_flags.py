"""Screen llama-server flags for chat: start it with the given flags, hold chats, compare the client's and the
server's pace (results/cpu-engines/llamacpp-flags/screening.jsonl came from this).

usage: .venv/bin/python results/cpu-engines/llamacpp-flags/probe_llamacpp_flags.py GGUF VARIANT LABEL
           [llama-server flags...]
       environment: LEVELS=1,8 (users), REQS=4 (turns at one user), TURNS=2, REPLY=64-128 (tokens)

A quick screen, one engine alone, no answer check: the figures that decide go through scripts/bench_cpu_engines.py
(the app's supervisor, the canary first, rounds alternated). Prints one JSON line per level: total tok/s, first
text P50 ms, the client's decode tok/s (None for a model whose tokens carry no text), the server's own
(timings.predicted_per_second), the share of chunks that arrived bunched (gaps under 2 ms), the median prompt and
cached tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from backend.benchmarks.chat_workload import SYSTEM, ChatShape, conversations, tag
from backend.engines.llamacpp import DEFAULT_PREFIX

PORT = 18900


async def hold(http: httpx.AsyncClient, url: str, chat: Any, salt: int, out: list[dict[str, Any]]) -> None:
    history = [{"role": "system", "content": SYSTEM}]
    for n, turn in enumerate(chat.turns):
        history.append({"role": "user", "content": (tag(chat.index, salt) if n == 0 else "") + turn.message})
        body = {"model": "m", "messages": history, "stream": True, "max_tokens": turn.reply_tokens,
                "ignore_eos": True, "temperature": 0}  # fmt: skip
        t0 = time.perf_counter()
        times: list[float] = []
        pieces: list[str] = []
        timings: dict[str, Any] = {}
        async with http.stream("POST", url, json=body) as resp:
            async for line in resp.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                data = json.loads(line[5:])
                timings = data.get("timings") or timings
                choices = data.get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content") is not None:
                    times.append(time.perf_counter() - t0)
                    pieces.append(choices[0]["delta"]["content"])
        history.append({"role": "assistant", "content": "".join(pieces)})
        texted = len(times) > 2
        gaps = [b - a for a, b in itertools.pairwise(times)]
        out.append({
            "first": times[0] if texted else timings.get("prompt_ms", 0) / 1000,
            "n": len(times) if texted else timings.get("predicted_n", 0),
            "client_dec": (len(times) - 1) / (times[-1] - times[0]) if texted else None,
            "bunched": sum(g < 0.002 for g in gaps) / len(gaps) if texted else None,
            "server_dec": timings.get("predicted_per_second"),
            "prompt_n": timings.get("prompt_n"),
            "cache_n": timings.get("cache_n"),
        })  # fmt: skip


def engine_totals() -> dict[str, float]:
    """llama-server's own counters (with --metrics): prompt and decode tokens and seconds, decode calls."""
    try:
        text = httpx.get(f"http://127.0.0.1:{PORT}/metrics", timeout=5).text
    except httpx.HTTPError:
        return {}
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:") and " " in line:
            name, value = line.rsplit(" ", 1)
            totals[name.removeprefix("llamacpp:")] = float(value)
    return totals


async def level(users: int, requests: int, shape: ChatShape) -> dict[str, Any]:
    url = f"http://127.0.0.1:{PORT}/v1/chat/completions"
    before = engine_totals()
    out: list[dict[str, Any]] = []
    salt = random.randrange(10**6)
    queue = iter(conversations(shape, requests))
    # no keep-alive: llama-server closes a connection after a few requests (cpp-httplib), which httpx then reuses
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_keepalive_connections=0)) as http:

        async def user() -> None:
            for chat in queue:
                await hold(http, url, chat, salt, out)

        t0 = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(users)))
        duration = time.perf_counter() - t0

    def med(key: str) -> float | None:
        values = [o[key] for o in out if o[key] is not None]
        return round(statistics.median(values), 2) if values else None

    first = med("first")
    after = engine_totals()
    spent = {k: round(after[k] - before.get(k, 0.0), 2) for k in after if k.endswith("_total")}
    return {"engine": spent, "wall_s": round(duration, 2), "users": users,
            "tok_s": round(sum(o["n"] for o in out) / duration, 1),
            "first_ms": round(first * 1000) if first is not None else None, "client_dec": med("client_dec"),
            "server_dec": med("server_dec"), "bunched": med("bunched"), "prompt_n": med("prompt_n"),
            "cache_n": med("cache_n")}  # fmt: skip


def main(gguf: str, variant: str, label: str, flags: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "GGML_"))}
    env["GGML_BACKEND_PATH"] = str(DEFAULT_PREFIX / "bin" / "cpu" / f"libggml-cpu-{variant}.so")
    argv = [str(DEFAULT_PREFIX / "bin" / "llama-server"), "--model", gguf, "--alias", "m", "--host", "127.0.0.1",
            "--port", str(PORT), "--jinja", "--no-webui", "--cache-ram", "0", *flags]  # fmt: skip
    log = open(os.environ.get("LOG", os.devnull), "w")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{PORT}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        low, high = (int(x) for x in os.environ.get("REPLY", "64-128").split("-"))
        shape = ChatShape(turns=int(os.environ.get("TURNS", "2")), reply_tokens=(low, high), seed=0)
        asyncio.run(level(1, 1, ChatShape(turns=1, reply_tokens=(8, 8), seed=9)))  # the first shapes, not counted
        for users in (int(x) for x in os.environ.get("LEVELS", "1,8").split(",")):
            requests = max(int(os.environ.get("REQS", "4")), users * shape.turns)
            print(json.dumps({"label": label, **asyncio.run(level(users, requests, shape))}), flush=True)
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf", help="the model file")
    parser.add_argument("variant", help="the CPU kernels: libggml-cpu-VARIANT.so (haswell, zen4 ...)")
    parser.add_argument("label", help="the name each printed line carries")
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="llama-server's own flags")
    args = parser.parse_args()
    main(args.gguf, args.variant, args.label, args.flags)
