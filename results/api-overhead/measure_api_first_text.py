"""Where the API's first text goes (issue 28): one conversation of four turns sent 24 times at one user,
alternated, straight to the engine and through the app's API (the offline demo model on llama.cpp, started as
results/api-overhead/measure_api_overhead.py starts it); timed to the API's opening chunk (the app's own work before the
engine: the key, the quota, the template, the count) and to the first text.

    .venv/bin/python results/api-overhead/measure_api_first_text.py   -> results/api-overhead/demo/first-text.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import httpx
import measure_api_overhead as m

from backend.benchmarks.loadgen import stream_chat
from backend.config import ROOT
from backend.engines.base import bearer

HIST: list[dict[str, str]] = []
for i in range(4):
    HIST += [
        {"role": "user", "content": f"Tell me something about topic number {i}."},
        {"role": "assistant", "content": "Here is a short answer about it. " * 8},
    ]


async def one(http: httpx.AsyncClient, url: str, key: str, model: str, n: int) -> tuple[float | None, float]:
    """(ms to the opening chunk or None, ms to the first text) of one streamed request."""
    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are helpful."},
            *HIST,
            {"role": "user", "content": f"And about {n}?"},
        ],
        "stream": True,
        "max_tokens": 8,
        "temperature": 0,
    }
    streamed = await stream_chat(http, url + "/v1/chat/completions", bearer(key), body)
    assert streamed.error is None and streamed.first_text_at is not None, streamed.error or "a reply without text"
    opened = None if streamed.opened_at is None else (streamed.opened_at - streamed.start) * 1000
    return opened, (streamed.first_text_at - streamed.start) * 1000


async def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="api-first-text-"))
    s = m.start_engine("demo", work)
    assert await s.supervisor.wait_ready(600)
    ep = s.endpoint
    app, url, key = await asyncio.to_thread(
        m.start_app, ep.base_url, ep.api_key, ep.model, work, 8597, m.MODELS["demo"][1]
    )
    try:
        async with httpx.AsyncClient(timeout=60, trust_env=False) as http:
            models = (await http.get(url + "/v1/models", headers=bearer(key))).json()["data"]
            default = next(x["id"] for x in models if x["id"].endswith(":default"))
            res: dict[str, list[float]] = {"engine": [], "app": [], "app_open": []}
            for n in range(24):
                # each request's last message is new to the engine (the one before it asked another): both pay it
                o, t = await one(http, ep.base_url, ep.api_key, ep.model, 2 * n)
                res["engine"].append(t)
                o, t = await one(http, url, key, default, 2 * n + 1)
                res["app"].append(t)
                assert o is not None, "the API sends its opening chunk first"
                res["app_open"].append(o)
            summary = {
                k: {
                    "median_ms": round(statistics.median(v[2:]), 1),
                    "min_ms": round(min(v[2:]), 1),
                    "max_ms": round(max(v[2:]), 1),
                }
                for k, v in res.items()
            }  # the first two: warming
            out = {
                "cpu": m.cpu_model(),
                "load": [round(x, 2) for x in os.getloadavg()],
                "created": time.strftime("%Y-%m-%d %H:%M %Z"),
                "requests": len(res["app"]) - 2,
                "figures": {
                    "engine alone: first text": summary["engine"],
                    "through the app: opening chunk": summary["app_open"],
                    "through the app: first text": summary["app"],
                },
                "raw_ms": res,
            }
            path = ROOT / "results" / "api-overhead" / "demo" / "first-text.json"
            path.write_text(json.dumps(out, indent=1))
            print(json.dumps(out["figures"], indent=1))
    finally:
        app.terminate()
        app.wait(30)
        await s.stop()


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    asyncio.run(main())
