"""The page while the engine starts: a message sent before the engine is ready gets the "starting, N s" notice,
updated as the seconds go by, then "ready", then its reply; in English and in Chinese.

The engine is a StubEngine (tests/stub_engine.py) the app reaches as an external engine: the test decides when it
becomes ready, so the page is certain to see it starting (a real engine may be ready before the page is)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.app_process import REPLY
from tests.browser.pages import (
    LOCALES,
    app_with_stub_engine,
    matching,
    message_pattern,
    number_shown,
    open_page,
    send,
    wait_finished,
)

pytestmark = [pytest.mark.browser, pytest.mark.integration]

REPLY_TEXT = "Fake engine says hello."


@pytest.mark.parametrize("locale", LOCALES)
async def test_message_sent_while_the_engine_starts_shows_the_seconds_then_ready_then_the_reply(
    browser,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    locale: str,
) -> None:
    starting, ready = message_pattern("starting", locale), message_pattern("ready", locale)
    # the engine is not ready until the test says so
    async with app_with_stub_engine(tmp_path / "data", reply=REPLY_TEXT, ready=False) as (app, engine):
        assert (await asyncio.to_thread(app.health))["engine"]["state"] == "starting"
        page = await open_page(browser, app.url, locale)
        before = await page.locator(REPLY).count()
        await send(page, "Hello")

        first = await number_shown(page, starting)
        later = await number_shown(page, starting, above=first)  # the same notice, updated every second
        assert await matching(page, starting) == 1, "one notice, updated in place"
        assert engine.requests == [], "nothing is asked of an engine that is not ready"

        engine.ready.set()
        assert await number_shown(page, ready) >= later
        assert await matching(page, starting) == 0, "the starting notice became the ready notice"
        final = await wait_finished(page, before + 1)  # the notice first, then the reply
        assert final.startswith(REPLY_TEXT), final
        assert engine.conversations() == [[("user", "Hello")]], "the waiting message, asked once"
