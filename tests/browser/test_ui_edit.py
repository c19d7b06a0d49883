"""Editing a sent message in the page (its ✎ button, in English and Chinese): the later messages leave the page,
the edited one is answered again, and the model is asked the new text with the turns before it only.

The engine is a StubEngine (tests/stub_engine.py): what the model was asked is read from its requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.app_process import REPLY, USER
from tests.browser.pages import DETAILS, LOCALES, app_with_stub_engine, open_page, send, wait_finished

pytestmark = [pytest.mark.browser, pytest.mark.integration]

REPLY_TEXT = "A reply from the fake engine."


@pytest.mark.parametrize("locale", LOCALES)
async def test_an_edited_message_is_answered_again_and_the_model_forgets_the_old_text(
    browser,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    locale: str,
) -> None:
    async with app_with_stub_engine(tmp_path / "data", reply=REPLY_TEXT) as (app, engine):
        page = await open_page(browser, app.url, locale)
        await send(page, "What is the capital of France?")
        await wait_finished(page, 0)
        await send(page, "And of Germany?")
        await wait_finished(page, 1)
        first = page.locator(USER).first
        await first.hover()
        await first.locator(".edit-message").click()
        await page.fill("#edit-chat-input", "What is the capital of Italy?")
        await page.click(".confirm-edit")
        await page.wait_for_function(
            "([user, reply, details]) => document.querySelectorAll(user).length === 1 && "
            "document.querySelectorAll(reply).length === 1 && document.querySelector(reply).querySelector(details)",
            arg=[USER, REPLY, DETAILS],
            timeout=180_000,
        )
        assert (await first.inner_text()).strip() == "What is the capital of Italy?"
        assert engine.conversations()[-1] == [("user", "What is the capital of Italy?")]
        await send(page, "And of Spain?")
        await wait_finished(page, 1)
        assert engine.conversations()[-1] == [
            ("user", "What is the capital of Italy?"),
            ("assistant", REPLY_TEXT),
            ("user", "And of Spain?"),
        ]
        assert len(engine.requests) == 4
