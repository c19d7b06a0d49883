"""The real app (`chainlit run app.py`) in headless Chromium: streaming, stop button, languages, shutdown.

The app starts its own engine; with the hub out of reach it serves the offline demo model."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.app_process import CHROMIUM, REPLY, RunningApp, group_alive, start_app

pytestmark = [pytest.mark.browser, pytest.mark.integration]


@pytest.fixture(scope="module")
def app(demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApp]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: apt-get install -y chromium (make browser-deps does it)")
    data = tmp_path_factory.mktemp("app-data")
    # The hub is out of reach and the HF cache is empty: the app falls back to the demo model.
    app = start_app(data, HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(data / "hf"))
    try:
        app.wait_ready()
        yield app
    finally:
        app.kill()


async def open_chat(browser, app: RunningApp, locale: str):  # type: ignore[no-untyped-def]
    page = await (await browser.new_context(locale=locale)).new_page()
    await page.goto(app.url)
    await page.wait_for_selector("#chat-input", timeout=60_000)
    # The demo-model notice is the last thing on_chat_start sends: the session is set up.
    await page.wait_for_selector(f"{REPLY} >> text=SmolLM2", timeout=60_000)
    return page


async def send(page, text: str) -> None:  # type: ignore[no-untyped-def]
    await page.click("#chat-input")
    await page.keyboard.type(text)
    await page.keyboard.press("Enter")


# Records every length the n-th reply's text takes, from inside the page (no polling gap to miss a fast reply).
WATCH_LENGTHS = """([sel, n]) => {
  window.__lengths = [];
  new MutationObserver(() => {
    const el = document.querySelectorAll(sel)[n];
    const len = el ? (el.innerText || "").length : 0;
    if (len && window.__lengths[window.__lengths.length - 1] !== len) window.__lengths.push(len);
  }).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


async def test_reply_streams_token_by_token(app: RunningApp, browser) -> None:  # type: ignore[no-untyped-def]
    page = await open_chat(browser, app, "en-US")
    before = await page.locator(REPLY).count()
    await page.evaluate(WATCH_LENGTHS, [REPLY, before])
    await send(page, "Describe the city of Paris in a few sentences.")
    reply = page.locator(REPLY).nth(before)
    await page.wait_for_selector(f"{REPLY} >> nth={before} >> text=Template:", timeout=120_000)
    lengths = await page.evaluate("() => window.__lengths")
    final = await reply.inner_text()
    assert "Template: default" in final, final
    answer = final.split("Template: default")[0].strip()
    assert answer, f"an answer before the footer: {final!r}"  # its words are the model's (the canary checked it)
    assert len(lengths) >= 3, f"the reply should grow while streaming, saw lengths {lengths}"
    # the conversation is kept: a follow-up question answers in the same thread
    await send(page, "And Berlin?")
    await page.locator(REPLY).nth(before + 1).wait_for(timeout=60_000)
    await page.wait_for_selector(f"{REPLY} >> nth={before + 1} >> text=Template:", timeout=120_000)
    await page.screenshot(path=str(app.log.parent / "chat.png"), full_page=True)


async def test_stop_button_ends_the_reply_and_frees_the_engine(app: RunningApp, browser) -> None:  # type: ignore[no-untyped-def]
    page = await open_chat(browser, app, "en-US")
    before = await page.locator(REPLY).count()
    # Asked for by name: the demo model gets messages as they are unless a template is named.
    await send(page, "/writing Write a very long story about a robot who learns to paint.")
    reply = page.locator(REPLY).nth(before)
    await reply.wait_for(timeout=60_000)
    await page.wait_for_function(
        "([sel, n]) => (document.querySelectorAll(sel)[n]?.innerText || '').length > 20",
        arg=[REPLY, before],
        timeout=60_000,
    )
    await page.click("#stop-button")
    await page.wait_for_selector(f"{REPLY} >> nth={before} >> text=Stopped.", timeout=10_000)
    text = await reply.inner_text()
    assert "Template: writing" in text and len(text) > 20
    # the engine is no longer working on that reply
    deadline = time.monotonic() + 5
    running = None
    while time.monotonic() < deadline:
        running = await asyncio.to_thread(app.engine_metric, "requests_running")
        if running == 0:
            break
        await asyncio.sleep(0.2)
    assert running == 0
    assert await page.is_visible("#chat-input")


async def test_chinese_browser_gets_chinese_messages(app: RunningApp, browser) -> None:  # type: ignore[no-untyped-def]
    page = await (await browser.new_context(locale="zh-CN")).new_page()
    await page.goto(app.url)
    await page.wait_for_selector(f"{REPLY} >> text=演示模式", timeout=60_000)
    await send(page, "   ")  # whitespace only: a friendly message, nothing sent to the engine
    assert await page.locator("#chat-input").is_visible()
    await send(page, "你好")
    await page.wait_for_selector(f"{REPLY} >> text=模板：default", timeout=120_000)


USER = '.step[data-step-type="user_message"]'


async def test_user_text_is_never_rendered_as_html(app: RunningApp, browser) -> None:  # type: ignore[no-untyped-def]
    page = await open_chat(browser, app, "en-US")
    before = await page.locator(REPLY).count()
    await send(page, "<b id=injected>bold</b> <img id=injected-img src=x onerror=alert(1)>")
    await page.wait_for_selector(f"{REPLY} >> nth={before} >> text=Template:", timeout=120_000)
    assert await page.locator("#injected, #injected-img").count() == 0
    assert "<b id=injected>bold</b>" in await page.locator(USER).last.inner_text()


async def test_megabyte_message_gets_a_clear_answer(app: RunningApp, browser) -> None:  # type: ignore[no-untyped-def]
    page = await open_chat(browser, app, "en-US")
    await page.click("#chat-input")
    await page.keyboard.insert_text("长" * 1_000_000)
    await page.keyboard.press("Enter")
    await page.wait_for_selector(f"{REPLY} >> text=at most 200000 are accepted", timeout=60_000)
    before = await page.locator(REPLY).count()
    await send(page, "Hello")  # the chat still works
    await page.wait_for_selector(f"{REPLY} >> nth={before} >> text=Template:", timeout=120_000)


async def test_stop_at_once_then_chat_goes_on(app: RunningApp, browser) -> None:  # type: ignore[no-untyped-def]
    page = await open_chat(browser, app, "en-US")
    # Click stop the moment the button appears, before or at the first token (from inside the page: a fast
    # engine finishes a short reply within Playwright's own actionability checks).
    await page.evaluate(
        """() => new MutationObserver((_, obs) => {
             const b = document.querySelector('#stop-button');
             if (b) { b.click(); obs.disconnect(); }
           }).observe(document.body, {subtree: true, childList: true})"""
    )
    await send(page, "Write a long poem about the sea.")
    await page.wait_for_selector("#chat-submit", timeout=10_000)
    assert await page.locator('.step[data-step-type="assistant_message"] >> text=⚠').count() == 0
    before = await page.locator(REPLY).count()
    await send(page, "What is the capital of France?")
    await page.wait_for_selector(f"{REPLY} >> nth={before} >> text=Template:", timeout=120_000)
    running = await asyncio.to_thread(app.engine_metric, "requests_running")
    assert running == 0


def test_app_shutdown_leaves_no_engine_behind(app: RunningApp) -> None:
    engine_pid = app.health()["engine"]["pid"]
    assert engine_pid and group_alive(engine_pid)
    app.proc.send_signal(signal.SIGINT)
    app.proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while group_alive(engine_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_alive(engine_pid), "the engine outlived the app"
