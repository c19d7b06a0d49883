"""One headless Chromium per test module (Debian's build, never a downloaded one)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from tests.app_process import CHROMIUM, CHROMIUM_ARGS


@pytest_asyncio.fixture(scope="module")
async def browser() -> AsyncIterator[object]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        await browser.close()
