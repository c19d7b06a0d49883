"""Login and saved conversations in headless Chromium: log in, chat, restart the app, resume the thread from
the sidebar and go on with the model seeing the earlier turn; another user does not see it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.accounts.passwords import hash_password
from backend.accounts.users import write_users_file
from tests.app_process import CHROMIUM, REPLY, RunningApp, launch_app, login_env
from tests.chat_api import ChatSocket, login

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]

USER = '.step[data-step-type="user_message"]'
READY = "#chat-settings-open-modal"  # the settings panel is the last thing a chat's start (or resume) sends
PASSWORDS = {"alice": "alice-password", "bob": "bob-password"}
FIRST = "What is the capital of France?"


class Site:
    def __init__(self, app: RunningApp, env: dict[str, str], root: Path) -> None:
        self.app, self.env, self.root = app, env, root

    def restart(self) -> None:
        port = int(self.app.url.rsplit(":", 1)[1])
        self.app.stop()
        self.app = launch_app(self.env, self.app.log, port=port)
        self.app.wait_ready()


@pytest.fixture(scope="module")
def site(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: apt-get install -y chromium (make test-deps does it)")
    root = tmp_path_factory.mktemp("history-ui")
    users = root / "users.yaml"
    write_users_file(users, {name: hash_password(pw) for name, pw in PASSWORDS.items()})
    env = login_env(root / "data", tiny_model, users)
    site = Site(launch_app(env, root / "app.log"), env, root)
    try:
        site.app.wait_ready()
        yield site
    finally:
        site.app.stop()


async def log_in(browser, site: Site, name: str):  # type: ignore[no-untyped-def]
    page = await (await browser.new_context(locale="en-US")).new_page()
    await page.goto(site.app.url)
    await page.wait_for_selector("#email", timeout=60_000)
    await page.fill("#email", name)
    await page.fill("#password", PASSWORDS[name])
    await page.click('button[type="submit"]')
    await page.wait_for_selector(READY, timeout=60_000)
    return page


async def send(page, text: str) -> None:  # type: ignore[no-untyped-def]
    await page.click("#chat-input")
    await page.keyboard.type(text)
    await page.keyboard.press("Enter")


async def wait_reply(page, n: int) -> str:  # type: ignore[no-untyped-def]
    """The text of the n-th assistant reply once it is finished (its footer names the template)."""
    await page.wait_for_selector(f"{REPLY} >> nth={n} >> text=Template:", timeout=180_000)
    return str(await page.locator(REPLY).nth(n).inner_text())


async def test_wrong_password_shows_an_error(browser, site: Site) -> None:  # type: ignore[no-untyped-def]
    page = await (await browser.new_context(locale="en-US")).new_page()
    await page.goto(site.app.url)
    await page.wait_for_selector("#email", timeout=60_000)
    await page.fill("#email", "alice")
    await page.fill("#password", "not-her-password")
    await page.click('button[type="submit"]')
    await page.wait_for_timeout(1000)
    assert not await page.is_visible("#chat-input")
    assert "/login" in page.url


async def test_login_chat_restart_and_resume(browser, site: Site) -> None:  # type: ignore[no-untyped-def]
    page = await log_in(browser, site, "alice")
    await send(page, FIRST)
    first = await wait_reply(page, 0)
    thread = page.locator("#thread-history").get_by_text(FIRST)
    await thread.wait_for(timeout=30_000)

    await asyncio.to_thread(site.restart)

    await page.goto(site.app.url)  # still logged in: the session secret is kept in the data folder
    await page.wait_for_selector(READY, timeout=60_000)
    await page.locator("#thread-history").get_by_text(FIRST).click()
    await page.wait_for_url("**/thread/*", timeout=30_000)
    thread_id = page.url.rsplit("/", 1)[1]
    await page.wait_for_selector(f"{USER} >> text={FIRST}", timeout=60_000)
    await page.wait_for_selector(READY, timeout=60_000)
    assert (await page.locator(REPLY).first.inner_text()).strip() == first.strip()

    before = await asyncio.to_thread(site.app.engine_metric, "prompt_tokens")
    await send(page, "And of Germany?")
    await wait_reply(page, 1)
    with_history = await asyncio.to_thread(site.app.engine_metric, "prompt_tokens") - before
    assert f"Resumed thread {thread_id}: 2 messages restored" in site.app.log_text()
    await page.screenshot(path=str(site.root / "resumed.png"), full_page=True)

    # the same question in a new chat, for comparison: the resumed one carried the first turn too
    http = await login(site.app.url, "alice", PASSWORDS["alice"])
    fresh = ChatSocket(site.app.url, http)
    await fresh.connect()
    before = await asyncio.to_thread(site.app.engine_metric, "prompt_tokens")
    await fresh.ask("And of Germany?")
    without = await asyncio.to_thread(site.app.engine_metric, "prompt_tokens") - before
    await fresh.close()
    await http.aclose()
    assert with_history >= without + 20, (with_history, without)


async def test_another_user_sees_no_foreign_threads(browser, site: Site) -> None:  # type: ignore[no-untyped-def]
    page = await log_in(browser, site, "bob")
    await page.wait_for_timeout(2000)  # let the sidebar load
    assert await page.locator("#thread-history").get_by_text(FIRST).count() == 0
    alice = await log_in(browser, site, "alice")
    await alice.locator("#thread-history").get_by_text(FIRST).first.wait_for(timeout=30_000)
