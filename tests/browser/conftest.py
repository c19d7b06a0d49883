"""One headless Chromium per test module (Debian's build, never a downloaded one)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.app_process import CHROMIUM, CHROMIUM_ARGS


@pytest_asyncio.fixture(scope="module")
async def browser() -> AsyncIterator[object]:
    from playwright.async_api import async_playwright

    if not await asyncio.to_thread(Path(CHROMIUM).exists):
        pytest.fail("Chromium is missing: apt-get install -y chromium (make browser-deps does it)")
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        await browser.close()
