"""The key page (/api-keys) in headless Chromium, in English and Chinese: a logged-in user makes a named key (shown
once), a tool uses it with the official `openai` client, the user revokes it on the page, and the tool is refused
(401) from then on; a name of blanks is refused with a message in the page's language."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from backend.accounts.passwords import hash_password
from backend.accounts.users import write_users_file
from tests.app_process import READY, RunningApp, launch_app, login_env

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]

PASSWORDS = {"alice": "alice-password", "bo": "bo-password"}
# locale: (its user, words of the page's title, the refusal of a blank name)
LOCALES = {
    "en-US": ("alice", "API keys", "A key's name must have 1 to 64 characters, none of them control characters."),
    "zh-CN": ("bo", "API 密钥", "密钥名称须为 1 到 64 个字符，且不含控制字符。"),
}


@pytest.fixture(scope="module")
def app(spm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApp]:
    root = tmp_path_factory.mktemp("api-keys-ui")
    users = root / "users.yaml"
    write_users_file(users, {name: hash_password(pw) for name, pw in PASSWORDS.items()})
    # llama.cpp serving the tiny ERNIE model: any engine will do, and it starts in seconds
    running = launch_app(login_env(root / "data", spm_model, users, engine="llama.cpp"), root / "app.log")
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


def models(app: RunningApp, key: str) -> list[str]:
    with openai.OpenAI(base_url=app.url + "/v1", api_key=key, max_retries=0, timeout=60) as tool:
        return [m.id for m in tool.models.list().data]


@pytest.mark.parametrize("locale", LOCALES)
async def test_make_use_and_revoke_a_key_in_the_browser(browser, app: RunningApp, locale: str) -> None:  # type: ignore[no-untyped-def]
    user, title, blank_refused = LOCALES[locale]
    context = await browser.new_context(locale=locale)
    page = await context.new_page()
    await page.goto(app.url)
    await page.wait_for_selector("#email", timeout=60_000)
    await page.fill("#email", user)
    await page.fill("#password", PASSWORDS[user])
    await page.click('button[type="submit"]')
    await page.wait_for_selector(READY, timeout=60_000)

    await page.goto(app.url + "/api-keys")
    await page.wait_for_selector("#manage:not([hidden])", timeout=30_000)
    assert user in await page.inner_text("#who")
    assert await page.inner_text("h1") == title
    await page.fill("#name", "   ")
    await page.click("#create-button")
    await page.wait_for_function("() => document.querySelector('#error').textContent.trim() !== ''")
    assert blank_refused in await page.inner_text("#error")
    assert await page.locator("#keys tbody tr").count() == 0, "nothing was made"

    await page.fill("#name", "my editor")
    await page.click("#create-button")
    await page.wait_for_selector("#new:not([hidden])")
    key = (await page.inner_text("#new-key")).strip()
    row = page.locator("#keys tbody tr")
    await row.first.wait_for()
    assert await row.count() == 1 and "my editor" in await row.first.inner_text()
    assert key not in await page.inner_text("#keys"), "the list never shows the key"

    assert await asyncio.to_thread(models, app, key), "a tool uses the key"

    page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
    await row.first.locator("button.revoke").click()
    await page.wait_for_function("() => document.querySelectorAll('#keys tbody tr').length === 0")
    with pytest.raises(openai.AuthenticationError):
        await asyncio.to_thread(models, app, key)
    await context.close()
