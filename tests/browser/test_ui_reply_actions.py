"""What a reply offers, in the page's language: copy (Chainlit's own button), regenerate (the last reply asked
again: the model sees the conversation once, never the turn twice) and export of the conversation as Markdown and
JSON (the turns exactly as the model's history has them).

The engine is a StubEngine (tests/stub_engine.py): what the model was asked is read from its requests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from backend.chat.i18n import t
from backend.chat.render import export_markdown
from tests.app_process import READY, REPLY, RunningApp
from tests.browser.pages import DETAILS, LOCALES, app_with_stub_engine, open_page, send, wait_finished
from tests.stub_engine import StubEngine

pytestmark = [pytest.mark.browser, pytest.mark.integration]

REPLY_TEXT = "A reply from the fake engine."


@pytest_asyncio.fixture(scope="module")
async def chat(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[RunningApp, StubEngine]]:
    async with app_with_stub_engine(tmp_path_factory.mktemp("actions") / "data", reply=REPLY_TEXT) as running:
        yield running


def history(*asked: str) -> list[dict[str, str]]:
    """The model's history after turns that asked `asked` (the default template sends a message as it is)."""
    return [
        m for text in asked for m in ({"role": "user", "content": text}, {"role": "assistant", "content": REPLY_TEXT})
    ]


async def exported(page: Any, label: str) -> str:
    """Click the export button `label` of the last reply; the text of the file the page then offers."""
    links = page.locator("a.inline-file")
    before = await links.count()
    await page.get_by_role("button", name=label, exact=True).click()
    await links.nth(before).wait_for(timeout=60_000)
    response = await page.request.get(str(await links.nth(before).get_attribute("href")))
    return str(await response.text())


async def chat_twice(browser: Any, app: RunningApp, locale: str) -> Any:
    """A new chat page after two turns ("Hello", "Tell me more")."""
    page = await open_page(browser, app.url, locale)
    for n, text in enumerate(("Hello", "Tell me more")):
        await send(page, text)
        await wait_finished(page, n)
    return page


@pytest.mark.parametrize("locale", LOCALES)
async def test_export_gives_the_history_as_markdown_and_json(browser, chat, locale: str) -> None:  # type: ignore[no-untyped-def]
    app, _ = chat
    page = await chat_twice(browser, app, locale)
    kept = history("Hello", "Tell me more")
    assert await exported(page, t("action_export_md", locale)) == export_markdown(kept, locale)
    assert json.loads(await exported(page, t("action_export_json", locale))) == {"messages": kept}


@pytest.mark.parametrize("locale", LOCALES)
async def test_regenerate_asks_the_last_message_again_in_place(browser, chat, locale: str) -> None:  # type: ignore[no-untyped-def]
    app, engine = chat
    page = await chat_twice(browser, app, locale)
    regenerate = page.get_by_role("button", name=t("action_regenerate", locale), exact=True)
    assert await regenerate.count() == 1, "only the last reply offers it"
    asked = len(engine.requests)
    before = await page.locator(REPLY).nth(1).element_handle()
    await regenerate.click()
    # The reply asked before goes first: until then the page's two finished replies are the old ones.
    await before.wait_for_element_state("hidden", timeout=60_000)
    await page.wait_for_function(
        "([sel, details]) => document.querySelectorAll(sel).length === 2 && "
        "[...document.querySelectorAll(sel)].every(el => el.querySelector(details))",
        arg=[REPLY, DETAILS],
        timeout=180_000,
    )
    assert len(engine.requests) == asked + 1, "asked again, once"
    again = engine.conversations()[-1]
    assert again == [("user", "Hello"), ("assistant", REPLY_TEXT), ("user", "Tell me more")], (
        "the turn is not kept twice"
    )
    await send(page, "And then?")
    await wait_finished(page, 2)
    assert engine.conversations()[-1] == [*again, ("assistant", REPLY_TEXT), ("user", "And then?")]


# What the page writes to the clipboard (its text/plain part), recorded as it is written: reading the clipboard
# back depends on the page having the focus, which a headless page may lose.
RECORD_COPIES = """for (const name of ["write", "writeText"]) {
  const original = navigator.clipboard[name].bind(navigator.clipboard);
  navigator.clipboard[name] = async (data) => {
    window.__copied = typeof data === "string" ? data : await (await data[0].getType("text/plain")).text();
    return original(data).catch(() => undefined);
  };
}"""


async def test_the_copy_button_copies_the_reply_text(browser, chat) -> None:  # type: ignore[no-untyped-def]
    app, _ = chat
    context = await browser.new_context(locale="en-US", permissions=["clipboard-read", "clipboard-write"])
    await context.add_init_script(RECORD_COPIES)
    page = await context.new_page()
    await page.goto(app.url)
    await page.wait_for_selector(READY, timeout=60_000)
    await send(page, "Hello")
    await wait_finished(page, 0)
    await page.locator('.step[data-step-type="assistant_message"] button:has(svg.lucide-copy)').first.click()
    copied = await page.wait_for_function("() => window.__copied", timeout=60_000)
    assert str(await copied.json_value()).strip() == REPLY_TEXT, "the text alone, not its details"
    # no history without login: Chainlit has nowhere to keep a rating and offers none (test_ui_feedback.py)
    assert await page.locator('.step[data-step-type="assistant_message"] button:has(svg.lucide-thumbs-up)').count() == 0


async def test_a_regenerated_reply_stops_with_the_stop_button(browser, chat) -> None:  # type: ignore[no-untyped-def]
    app, engine = chat
    page = await chat_twice(browser, app, "en-US")
    engine.held.clear()
    engine.release.clear()
    engine.hold_path = "/v1/chat/completions"  # the regenerated reply's request waits until the test releases it
    try:
        await page.get_by_role("button", name=t("action_regenerate", "en-US"), exact=True).click()
        assert await asyncio.to_thread(engine.held.wait, 180), "the regenerated reply's request reached the engine"
        await page.click("#stop-button")  # the regenerate runs as a task the stop button reaches
        await page.wait_for_selector(f"{REPLY} >> nth=1 >> text={t('stopped', 'en-US').replace('*', '')}")
    finally:
        engine.hold_path = None
        engine.release.set()
    assert await page.locator(REPLY).count() == 2
