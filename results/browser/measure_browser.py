"""Measure what a user sees in a real browser, alone and while others chat: first text and tokens/s on the page.

usage: .venv/bin/python results/browser/measure_browser.py [--url http://127.0.0.1:8501] [--users 1,4,8]
           [--rounds 3] [--replies 32] [--out results/browser/NAME]

At each level of N users, one real page (headless Chromium) is the user measured while N-1 others chat through the
app's websocket as pages do (backend.benchmarks.loadtest's sessions: no rendering, so the machine's cores go to the
app and the engine, as where each user has a browser of their own), in conversations of four turns, with the same
prompts and reply length (256 tokens at most). The levels take turns (1 4 8 1 4 8 ..., `--rounds` rounds); the page
sends `--replies` messages per level in all, each in a fresh chat of a new tab (browser context) so that prompts stay
equal in length. A new tab each time: in one tab reloaded for each new chat (page.goto), Chromium's renderer took more
of the CPU with every chat and the engine, sharing the 2 cores, decoded one chat at 62, then 49, 41 ... 22 tok/s by
the twelfth (its own timings; 66-76 throughout with a tab per chat, 73-91 over the websocket alone).

Timing is taken inside the page (performance.now() from a MutationObserver) from the moment Enter is pressed to the
first reply text ("first text"), and from the first to the last text update (its pace: the reply's tokens, from its
details, over that time); the longest pause between two updates shows bursts. "First text, every user" pools the
page's replies with the other sessions' (the websocket's stream_start, loadtest.FIRST_TEXT). The total is the
engine's own counter of generated tokens over the page's replies (every user's tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from backend.benchmarks.loadtest import Reply, ask, open_chat
from backend.benchmarks.stats import percentile
from backend.ops.prometheus_text import sample_totals
from backend.serving.hardware import cpu_model
from tests.app_process import CHROMIUM, CHROMIUM_ARGS, REPLY

PROMPTS = [
    "Tell me a story about a small robot who learns to paint.",
    "What are three good habits for learning a new language? Explain each one.",
    "Describe a walk through a forest in autumn.",
]
MAX_TOKENS = 256  # the page's own default (chat.max_tokens); the other sessions set the same
TURNS = 4  # an other session's conversation, then a new one
OBSERVER = """([sel, n]) => {
  // Every assistant message from the n-th on is timed on its own; the one whose details come is the reply (an app
  // notice before it, "waiting for the engine" say, never gets details).
  window.__t = {sent: performance.now(), each: {}};
  new MutationObserver(() => {
    const now = performance.now();
    document.querySelectorAll(sel).forEach((el, i) => {
      if (i < n || window.__t.done !== undefined) return;
      const text = el.innerText || "";
      if (!text.trim()) return;
      const t = window.__t.each[i] ??= {gap: 0, updates: 0};
      if (el.querySelector(".reply-details")) { window.__t.done = i; t.done = now; return; }  // the details come last
      if (t.last !== undefined && text !== t.text) t.gap = Math.max(t.gap, now - t.last);
      if (text === t.text) return;
      t.text = text;
      t.first ??= now;
      t.last = now;
      t.updates += 1;
    });
  }).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""
REPLY_TOKENS = re.compile(r"(\d+) prompt \+ (\d+) reply tokens")  # the details line (catalogue: en)
GENERATED = {"llama.cpp": "llamacpp:tokens_predicted_total"}  # else vLLM's name


def health(app_url: str) -> dict[str, Any]:
    return dict(json.load(urllib.request.urlopen(app_url + "/healthz", timeout=10)))


def generated_tokens(app_url: str) -> float:
    """Tokens the engine generated so far, by its own counter (the app's /metrics/engine)."""
    name = health(app_url)["engine"].get("name")
    text = urllib.request.urlopen(app_url + "/metrics/engine", timeout=10).read().decode()
    return sample_totals(text).get(GENERATED.get(name, "vllm:generation_tokens_total"), 0.0)


async def fresh_chat(page: Any, url: str) -> None:
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


async def page_reply(page: Any, url: str, prompt: str) -> dict[str, Any]:
    """One reply in a fresh chat, timed in the page."""
    await fresh_chat(page, url)
    n = await page.locator(REPLY).count()
    await page.click("#chat-input")
    await page.keyboard.type(prompt)
    await page.evaluate(OBSERVER, [REPLY, n])
    await page.keyboard.press("Enter")
    await page.wait_for_function("() => window.__t && window.__t.done !== undefined", timeout=600_000, polling=100)
    found = await page.evaluate("() => window.__t")
    done = found["done"]
    t = {**found["each"][str(done)], "sent": found["sent"], "gap": found["each"][str(done)]["gap"]}
    shown = REPLY_TOKENS.search(await page.locator(REPLY).nth(done).inner_text())
    tokens = int(shown.group(2)) if shown else 0
    stream_s = (t["last"] - t["first"]) / 1000
    return {
        "prompt": prompt,
        "first_text_s": round((t["first"] - t["sent"]) / 1000, 4),
        "stream_s": round(stream_s, 3),
        "tokens": tokens,
        "tokens_per_s": round((tokens - 1) / stream_s, 2) if stream_s > 0 and tokens > 1 else None,
        "page_updates": t.get("updates", 0),
        "notices_before": done - n,  # app notices between the message and its reply
        "longest_pause_s": round(t["gap"] / 1000, 3),
    }


async def other_user(index: int, url: str, done: list[Reply], stop: asyncio.Event) -> None:
    """One more user chatting through the websocket until `stop`, in conversations of TURNS turns."""
    turn = 0
    while not stop.is_set():
        chat = await open_chat(url, MAX_TOKENS)
        try:
            for _ in range(TURNS):
                if stop.is_set():
                    break
                reply = await ask(chat, index, turn % TURNS, PROMPTS[(index + turn) % len(PROMPTS)])
                if not stop.is_set():  # a reply that ended after the page's last one is not counted
                    done.append(reply)
                turn += 1
        finally:
            await chat.close()


async def level(browser: Any, url: str, users: int, replies: int) -> dict[str, Any]:
    """`replies` page replies while users-1 others chat; the page's replies and every user's first text."""
    stop, others = asyncio.Event(), []
    background: list[Reply] = []
    tasks = [asyncio.create_task(other_user(i + 1, url, background, stop)) for i in range(users - 1)]
    page = await (await browser.new_context(locale="en-US")).new_page()
    try:
        if tasks:
            await asyncio.sleep(3)  # the others under way before the page sends
        before, started = generated_tokens(url), time.monotonic()
        rows = []
        for i in range(replies):  # each reply in a new tab (below)
            await page.context.close()
            page = await (await browser.new_context(locale="en-US")).new_page()
            rows.append(await page_reply(page, url, PROMPTS[i % len(PROMPTS)]))
        wall = time.monotonic() - started
        await asyncio.sleep(0.5)  # the engine's counter may trail the reply by a moment
        total = (generated_tokens(url) - before) / wall
        others = list(background)
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await page.context.close()
    firsts = [r["first_text_s"] for r in rows] + [r.first_text_s for r in others if r.ok and r.first_text_s]
    rates = [r["tokens_per_s"] for r in rows if r["tokens_per_s"]]
    return {
        "users": users,
        "page": rows,
        "others_ok": sum(r.ok for r in others),
        "others_failed": sum(not r.ok for r in others),
        "first_text_s_p50": round(statistics.median(r["first_text_s"] for r in rows), 4),
        "tokens_per_s_p50": round(statistics.median(rates), 2) if rates else None,
        "longest_pause_s_p50": round(statistics.median(r["longest_pause_s"] for r in rows), 3),
        "every_user_first_text_s": {
            "p50": round(percentile(firsts, 50), 4),
            "p90": round(percentile(firsts, 90), 4),
            "replies": len(firsts),
        },
        "total_tok_s": round(total, 1),
        "seconds": round(wall, 1),
    }


def wait_serving(url: str, timeout_s: float = 3600) -> None:
    """Until the engine serves (a first start's tune done): a page that sends before would time the wait."""
    deadline = time.monotonic() + timeout_s
    while health(url)["engine"].get("state") != "ready" and time.monotonic() < deadline:
        time.sleep(2)


async def measure(url: str, levels: list[int], rounds: int, replies: list[int]) -> list[dict[str, Any]]:
    from playwright.async_api import async_playwright

    wait_serving(url)

    runs = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for r in range(rounds):
            for users in levels:
                found = await level(browser, url, users, math.ceil(replies[levels.index(users)] / rounds))
                found["round"] = r + 1
                runs.append(found)
                print(json.dumps({k: v for k, v in found.items() if k != "page"}), flush=True)
        await browser.close()
    return runs


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8501")
    parser.add_argument("--users", default="1", help="levels of users at once, in turn: 1,4,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--replies", default="32", help="the page's replies per level over all rounds: one for all, or one per level"
    )
    parser.add_argument("--out", default="results/browser")
    args = parser.parse_args()
    levels = [int(u) for u in args.users.split(",")]
    replies = [int(r) for r in args.replies.split(",")]
    replies = replies * len(levels) if len(replies) == 1 else replies
    load = os.getloadavg()
    runs = asyncio.run(measure(args.url, levels, args.rounds, replies))
    state = health(args.url)
    summary: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": f"{cpu_model()}, {os.cpu_count()} CPU cores, load average before {load[0]:.2f}, after "
        f"{os.getloadavg()[0]:.2f}",
        "engine": state["engine"],
        "check": state.get("check"),
        "tune": {k: (state.get("tune") or {}).get(k) for k in ("chosen", "reason", "seconds")},
        "settings": {
            "users": levels,
            "rounds": args.rounds,
            "page_replies": replies,
            "max_tokens": MAX_TOKENS,
            "others_turns": TURNS,
        },
        "runs": runs,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "browser_latency.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False))
    lines = [
        "| users | page: first text s | page: tokens/s | page: longest pause s | every user: first text P50 s "
        "| every user: P90 s | total tok/s (engine) | replies (page + others) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for users in levels:
        mine = [r for r in runs if r["users"] == users]

        def col(key: str, rows: list[dict[str, Any]] = mine) -> str:
            return spread([float(r[key]) for r in rows if r[key] is not None])

        every = [r["every_user_first_text_s"] for r in mine]
        count = sum(len(r["page"]) for r in mine) + sum(r["others_ok"] for r in mine)
        failed = sum(r["others_failed"] for r in mine)
        lines.append(
            f"| {users} | {col('first_text_s_p50')} | {col('tokens_per_s_p50')} | {col('longest_pause_s_p50')} | "
            f"{spread([e['p50'] for e in every])} | {spread([e['p90'] for e in every])} | {col('total_tok_s')} | "
            f"{count}{f' ({failed} failed)' if failed else ''} |"
        )
    engine = state["engine"]
    (out / "browser_latency.md").write_text(
        f"Measured {summary['when']} on {summary['machine']}; engine {engine.get('name')} "
        f"({(state.get('check') or {}).get('candidate')}; the tune: {summary['tune']['chosen']}); model: "
        f"{engine.get('note') or 'configured'}\n\nMedians over {args.rounds} rounds (min-max of the rounds' medians); "
        "levels alternated; one page measured, the other users on the app's websocket.\n\n" + "\n".join(lines) + "\n"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
