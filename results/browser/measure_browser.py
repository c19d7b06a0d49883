"""Measure what a user sees: time to first token and tokens/s in a real browser, against a running app.

usage: .venv/bin/python results/browser/measure_browser.py [--url http://127.0.0.1:8501] [--runs 5]
           [--out results/browser]

Timing is taken inside the page (performance.now() from a MutationObserver) from the moment Enter is
pressed to the first reply text, and from the first to the last text update. Token counts come from
the engine's own counter (vllm:generation_tokens_total, llamacpp:tokens_predicted_total) read before and
after each reply.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from backend.ops.prometheus_text import sample_totals
from backend.serving.hardware import cpu_model
from tests.app_process import CHROMIUM, CHROMIUM_ARGS, REPLY

PROMPTS = [
    "Tell me a story about a small robot who learns to paint.",
    "What are three good habits for learning a new language? Explain each one.",
    "Describe a walk through a forest in autumn.",
]
OBSERVER = """([sel, n]) => {
  window.__t = {sent: performance.now()};
  new MutationObserver(() => {
    const el = document.querySelectorAll(sel)[n];
    if (!el) return;
    const text = el.innerText || "";
    if (!text.trim()) return;
    const now = performance.now();
    if (el.querySelector(".reply-details")) { window.__t.done ??= now; return; }  // the details come last
    window.__t.first ??= now;
    window.__t.last = now;
    window.__t.updates = (window.__t.updates || 0) + 1;
  }).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


GENERATED = {"llama.cpp": "llamacpp:tokens_predicted_total"}  # else vLLM's name
# The engine's own seconds spent generating (after each request's first token), for its own pace.
DECODING = {"llama.cpp": "llamacpp:tokens_predicted_seconds_total"}  # else vLLM's


def engine_counters(app_url: str) -> tuple[float, float]:
    """Tokens the engine generated so far and its seconds decoding, by its own counters (the app's /metrics/engine)."""
    health = json.load(urllib.request.urlopen(app_url + "/healthz", timeout=10))
    name = health["engine"].get("name")
    text = urllib.request.urlopen(app_url + "/metrics/engine", timeout=10).read().decode()
    totals = sample_totals(text)
    tokens = totals.get(GENERATED.get(name, "vllm:generation_tokens_total"), 0.0)
    return tokens, totals.get(DECODING.get(name, "vllm:request_decode_time_seconds_sum"), 0.0)


async def fresh_chat(page, url: str) -> None:  # type: ignore[no-untyped-def]
    """A new chat whose first turn is over: that turn brings the notices (the demo model's), not a reply to time."""
    await page.goto(url)
    await page.wait_for_selector("#chat-input", timeout=60_000)
    await asyncio.sleep(1)  # let on_chat_start finish
    await page.click("#chat-input")
    await page.keyboard.type("/no-such-template hello")  # refused by the app: it never reaches the model
    await page.keyboard.press("Enter")
    await page.wait_for_function(
        "(sel) => document.querySelectorAll(sel).length > 0 && !document.querySelector('#stop-button')",
        arg=REPLY,
        timeout=60_000,
    )


async def measure(url: str, runs: int) -> list[dict]:
    from playwright.async_api import async_playwright

    results = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = await browser.new_page()
        await fresh_chat(page, url)
        for i in range(runs):
            n = await page.locator(REPLY).count()
            before, decoding = engine_counters(url)
            await page.click("#chat-input")
            await page.keyboard.type(PROMPTS[i % len(PROMPTS)])
            await page.evaluate(OBSERVER, [REPLY, n])
            await page.keyboard.press("Enter")
            await page.wait_for_function("() => window.__t && window.__t.done", timeout=300_000, polling=100)
            t = await page.evaluate("() => window.__t")
            await asyncio.sleep(0.5)  # the engine's counters may trail the reply by a moment
            after, decoded = engine_counters(url)
            tokens, engine_s = after - before, decoded - decoding
            stream_s = (t["last"] - t["first"]) / 1000
            results.append(
                {
                    "prompt": PROMPTS[i % len(PROMPTS)],
                    "ttft_s": round((t["first"] - t["sent"]) / 1000, 4),
                    "stream_s": round(stream_s, 3),
                    "tokens": int(tokens),
                    "tokens_per_s": round((tokens - 1) / stream_s, 2) if stream_s > 0 else None,
                    "engine_tokens_per_s": round((tokens - 1) / engine_s, 2) if engine_s > 0 else None,
                    "page_updates": t.get("updates", 0),
                }
            )
            print(results[-1], flush=True)
            await fresh_chat(page, url)  # a fresh conversation per run keeps prompts equal in length
        await browser.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8501")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default="results/browser")
    args = parser.parse_args()
    load = os.getloadavg()
    rows = asyncio.run(measure(args.url, args.runs))
    health = json.load(urllib.request.urlopen(args.url + "/healthz", timeout=10))
    cpu = cpu_model()
    ttfts = sorted(r["ttft_s"] for r in rows)
    rates = sorted(r["tokens_per_s"] for r in rows if r["tokens_per_s"])
    summary = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{cpu}, {os.cpu_count()} CPU cores, load average before {load[0]:.2f}",
        "check": health.get("check"),
        "ttft_s_quartiles": [ttfts[len(ttfts) // 4], ttfts[(3 * len(ttfts)) // 4]],
        "tokens_per_s_quartiles": [rates[len(rates) // 4], rates[(3 * len(rates)) // 4]],
        "engine": health["engine"],
        "ttft_s_median": statistics.median(r["ttft_s"] for r in rows),
        "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rows if r["tokens_per_s"]),
        "engine_tokens_per_s_median": round(
            statistics.median(r["engine_tokens_per_s"] for r in rows if r["engine_tokens_per_s"]), 2
        ),
        "runs": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "browser_latency.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False))
    lines = [
        "| run | TTFT in browser (s) | tokens | streaming (s) | tokens/s in browser | engine's own tokens/s "
        "| page updates |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows, 1):
        cells = [i, f"{r['ttft_s']:.3f}", r["tokens"], f"{r['stream_s']:.2f}", r["tokens_per_s"],
                 r["engine_tokens_per_s"], r["page_updates"]]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines.append(
        f"| **median** | **{summary['ttft_s_median']:.3f}** | | | **{summary['tokens_per_s_median']}** | "
        f"**{summary['engine_tokens_per_s_median']}** | |"
    )
    q_ttft, q_rate = summary["ttft_s_quartiles"], summary["tokens_per_s_quartiles"]
    lines.append(f"| quartiles | {q_ttft[0]:.3f}-{q_ttft[1]:.3f} | | | {q_rate[0]}-{q_rate[1]} | | |")
    (out / "browser_latency.md").write_text(
        f"Measured {summary['when']} on {summary['machine']}; engine {health['engine'].get('name')} "
        f"({(health.get('check') or {}).get('candidate')}); model: {health['engine']['note'] or 'configured'}\n\n"
        + "\n".join(lines)
        + "\n"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
