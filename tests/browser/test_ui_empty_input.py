"""A message the user cannot see (spaces and zero-width spaces) is refused as empty, in the page's language, and
reaches no engine.

The engine is a StubEngine (tests/stub_engine.py): it records every request, so "nothing reached the engine" is a
fact, not a counter read at the right moment."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.errors import CATALOG, lang_of
from tests.app_process import REPLY
from tests.browser.pages import LOCALES, app_with_stub_engine, open_page, wait_turn_over

pytestmark = [pytest.mark.browser, pytest.mark.integration]

# The page sends it: JavaScript's trim() keeps U+200B and the other zero-width characters, which are no white space.
INVISIBLE = "   \u200b\u200b  \u200c\u200d\u2060\ufeff "


@pytest.mark.parametrize("locale", LOCALES)
async def test_invisible_message_is_refused_as_empty(browser, tmp_path: Path, locale: str) -> None:  # type: ignore[no-untyped-def]
    async with app_with_stub_engine(tmp_path / "data") as (app, engine):
        page = await open_page(browser, app.url, locale)
        before = await page.locator(REPLY).count()
        await page.click("#chat-input")
        await page.keyboard.insert_text(INVISIBLE)
        await page.keyboard.press("Enter")
        shown = await wait_turn_over(page, before)
        message, hint = CATALOG["input.empty"][lang_of(locale)]
        assert message in shown and hint in shown, shown
        assert engine.requests == [], "the invisible message reached the engine"
