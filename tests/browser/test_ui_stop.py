"""The stop button shows one stop notice, in the page's language: the stopped reply's own line, never Chainlit's
English "Task manually stopped." beside it.

The engine is a StubEngine (tests/stub_engine.py) that holds the reply's request until the test releases it, so the
stop is certain to land while the reply is awaited."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from backend.chat.i18n import t
from tests.app_process import REPLY
from tests.browser.pages import LOCALES, app_with_stub_engine, open_page, send, wait_finished, wait_turn_over

pytestmark = [pytest.mark.browser, pytest.mark.integration]

CHAINLIT_STOP = "Task manually stopped."


@pytest.mark.parametrize("locale", LOCALES)
async def test_a_stopped_reply_shows_one_stop_notice_in_the_page_language(browser, tmp_path: Path, locale: str) -> None:  # type: ignore[no-untyped-def]
    stopped = t("stopped", locale).replace("*", "")  # the page renders the Markdown emphasis
    async with app_with_stub_engine(tmp_path / "data") as (app, engine):
        page = await open_page(browser, app.url, locale)
        before = await page.locator(REPLY).count()
        engine.hold_path = "/v1/chat/completions"
        await send(page, "Hello")
        assert await asyncio.to_thread(engine.held.wait, 180), "the reply's request reached the engine"
        await page.click("#stop-button")
        shown = await wait_turn_over(page, before)
        await page.wait_for_selector(f"{REPLY} >> text={stopped}", timeout=60_000)
        texts = await page.locator(REPLY).all_inner_texts()
        assert sum(stopped in text for text in texts[before:]) == 1, texts
        assert not [text for text in texts if CHAINLIT_STOP in text], texts
        failed = {t(key, locale, error="").split()[0] for key in ("interrupted", "error")}  # how a failure begins
        assert not [mark for mark in failed if mark in "".join(texts[before:])], shown
        engine.hold_path = None
        engine.release.set()
        await send(page, "Hello again")  # the chat goes on
        await wait_finished(page, len(texts))
