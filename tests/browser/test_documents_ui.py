"""Documents as context in headless Chromium: a file attached in the chat is taken into the tab's library; a
question about it, in English and in Chinese, reaches the engine with the passage that holds the fact and the reply
names its source, which opens on a click; another browser (another owner) asking the same finds nothing of it.

The engine is the tests' FakeEngine (tests/app_process.py), which records what the model was asked: what is checked
here is what the app sends and shows. The fact itself is a marker no model can know."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.app_process import FakeEngine, RunningApp
from tests.browser.pages import app_with_fake_engine, open_page, send, wait_finished
from tests.isolation import new_markers, shows

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]

SOURCES = ".reply-sources"


@pytest_asyncio.fixture(scope="module")
async def site(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[RunningApp, FakeEngine]]:
    async with app_with_fake_engine(tmp_path_factory.mktemp("documents-ui"), reply="The answer.") as running:
        yield running


def last_user_message(engine: FakeEngine) -> str:
    return [content for role, content in engine.conversations()[-1] if role == "user"][-1]


async def attach(page: Any, name: str, body: str) -> None:
    await page.locator('input[type="file"]').first.set_input_files(
        files=[{"name": name, "mimeType": "text/markdown", "buffer": body.encode()}]
    )


async def test_a_document_answers_in_both_languages_with_its_source_for_its_owner_only(
    browser: Any, site: tuple[RunningApp, FakeEngine]
) -> None:
    app, engine = site
    marker = new_markers(1)[0]
    owner = await open_page(browser, app.url, "en-US")
    await attach(owner, "vault.md", f"# Vault\nThe vault code is {marker}.\n\n保险库的密码是 {marker}。\n")
    await send(owner, "What is the vault code?")
    await owner.wait_for_selector('text=Added "vault.md" to your documents', timeout=60_000)
    await wait_finished(owner, 1)  # 0 is the app's notice that the file was added
    asked = last_user_message(engine)
    assert shows(asked, marker) and "[1] vault.md, Vault" in asked and asked.endswith("What is the vault code?")
    sources = owner.locator(SOURCES).first
    await sources.wait_for(timeout=60_000)
    assert "[1] vault.md · Vault" in await sources.inner_text()
    await sources.locator("summary").first.click()
    assert shows(await sources.locator(".reply-source-text").first.inner_text(), marker)

    await send(owner, "保险库的密码是什么？")
    await wait_finished(owner, 2)
    asked_zh = last_user_message(engine)
    assert shows(asked_zh, marker) and "问题：保险库的密码是什么？" in asked_zh
    assert await owner.locator(SOURCES).count() == 2

    other = await open_page(browser, app.url, "zh-CN")
    before = len(engine.requests)
    await send(other, "What is the vault code? 保险库的密码是什么？")
    await wait_finished(other, 0)
    assert len(engine.requests) == before + 1
    assert not shows(last_user_message(engine), marker)
    assert await other.locator(SOURCES).count() == 0
