"""A broken configuration (an ERNIE_* override with a bad value) is told in the chat, in the page's language: what
is wrong, where it was set, what to do; no traceback, and the app keeps answering."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from backend.errors import CATALOG, lang_of
from tests.app_process import REPLY, RunningApp, start_app
from tests.browser.pages import LOCALES, open_page, send, wait_turn_over
from tests.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration]

# chat.max_tokens must be an integer; pydantic's reason for this value, in each language (CATALOG's phrases)
BAD = {"chat__max_tokens": "lots"}
REASON = {"en": "valid integer", "zh": "应为整数"}


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApp]:
    app = start_app(tmp_path_factory.mktemp("config-error"), **BAD)  # no engine starts: there is no configuration
    try:
        wait_until(app.answering, "the app's page")
        yield app
    finally:
        app.kill()


@pytest.mark.parametrize("locale", LOCALES)
async def test_bad_configuration_value_is_explained_in_the_chat(app: RunningApp, browser, locale: str) -> None:  # type: ignore[no-untyped-def]
    lang = lang_of(locale)
    page = await open_page(browser, app.url, locale, ready=REPLY)  # the chat's start says it at once
    told = await page.locator(REPLY).first.inner_text()
    message, hint = CATALOG["config.invalid"][lang]
    assert message.split("{")[0] in told, told  # "Invalid configuration in" / "配置无效（"
    for part in ("chat.max_tokens", "'lots'", "ERNIE_CHAT__MAX_TOKENS", REASON[lang], hint):
        assert part in told, (part, told)
    # a message gets the same explanation, and the app goes on answering
    before = await page.locator(REPLY).count()
    await send(page, "Hello")
    again = await wait_turn_over(page, before)
    assert again == told
    page_text = await page.inner_text("body")
    assert "Traceback" not in page_text and "Traceback" not in app.log_text()
    assert app.proc.poll() is None, "the app is still running"
    assert await asyncio.to_thread(app.answering)
