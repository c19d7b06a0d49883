"""A self-hosted chat is self-contained: the page, a chat with a reply and its details, the settings panel, the
Readme and the dark theme ask nothing of any host but the app's own (offline it would fail; online it would tell a
third party who chats). Every request the page makes is recorded (Playwright's "request" event), in both languages.

The engine is a StubEngine (tests/stub_engine.py)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.app_process import READY
from tests.browser.pages import LOCALES, app_with_stub_engine, send, wait_finished

pytestmark = [pytest.mark.browser, pytest.mark.integration]

LOCAL = {"127.0.0.1", "localhost"}


@pytest.mark.parametrize("locale", LOCALES)
async def test_the_page_loads_nothing_from_other_hosts(browser, tmp_path: Path, locale: str) -> None:  # type: ignore[no-untyped-def]
    async with app_with_stub_engine(tmp_path / "data") as (app, _):
        context = await browser.new_context(locale=locale)
        page = await context.new_page()
        asked: list[str] = []
        page.on("request", lambda request: asked.append(request.url))
        await page.goto(app.url)
        await page.wait_for_selector(READY, timeout=60_000)
        await page.wait_for_selector("#ernie-status .ernie-state", timeout=60_000)
        await send(page, "Hello")
        await wait_finished(page, 0)  # the details element's code is fetched too
        await page.click(READY)  # the settings panel
        await page.keyboard.press("Escape")
        await page.emulate_media(color_scheme="dark")
        await page.evaluate("() => localStorage.setItem('vite-ui-theme', 'dark')")
        await page.reload()  # the dark logo
        await page.wait_for_selector(READY, timeout=60_000)
        await page.wait_for_load_state("networkidle")
    hosts = {urlsplit(url).hostname for url in asked if urlsplit(url).scheme in ("http", "https", "ws", "wss")}
    assert any("/logo" in url for url in asked) and any("ReplyDetails.jsx" in url for url in asked), asked
    assert hosts and hosts <= LOCAL, sorted(url for url in asked if urlsplit(url).hostname not in LOCAL)
