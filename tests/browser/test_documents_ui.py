"""Documents as context in headless Chromium, on the real app with login and the offline demo model served by
llama.cpp (as `make run` serves it offline): alice attaches a file holding a fact no model can know, asks about it in
English and in Chinese, and gets the fact with its source named under each reply, which opens on a click; the passage
reached the engine's request (llama-server's own log of each prompt, --log-prompts-dir); her thread reopened shows the
sources again. bob, logged in beside her, asks the same and finds nothing of it: no source, nothing in his request.

The fact is a random code, new at every run. The demo model (SmolLM2-135M) reads English only and its greedy answers
can sit on near ties that differ across CPUs (../shared/ENVIRONMENT.md), but copying a code from its prompt is no
near tie: greedy, it repeated the code in both languages in 5 runs of 5 (Intel Xeon, 2 cores, 2026-12-05)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from backend.accounts.passwords import hash_password
from backend.accounts.users import write_users_file
from backend.chat.sources import LEAD
from tests.app_process import CHROMIUM, REPLY, USER, RunningApp, launch_app, login_env
from tests.browser.pages import DETAILS, WAIT_MS, WITHOUT_ELEMENTS, send, sign_in
from tests.isolation import new_markers, shows

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]

PASSWORD = "a-password"
SOURCES = ".reply-sources"
FINISHED = f"{REPLY} {DETAILS}"  # a reply's details: it finished
QUESTION, QUESTION_ZH = "What is the vault code?", "保险库的密码是什么？"


@dataclass
class Site:
    app: RunningApp
    prompts: Path  # llama-server writes each request's prompt here

    def logged(self) -> set[Path]:
        return set(self.prompts.rglob("*")) if self.prompts.exists() else set()

    def prompts_since(self, before: set[Path]) -> list[str]:
        """The prompts of the chat requests the engine got since `before` (its folder's files then), as its chat
        template wrote them; the app's token counts are logged as lists of token ids, left out here."""
        texts = [p.read_text(errors="replace") for p in sorted(self.logged() - before) if p.is_file()]
        return [text for text in texts if not text.lstrip().startswith("[")]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: apt-get install -y chromium (make browser-deps does it)")
    root = tmp_path_factory.mktemp("documents-ui")
    users = root / "users.yaml"
    write_users_file(users, {name: hash_password(PASSWORD) for name in ("alice", "bob")})
    prompts = root / "prompts"
    env = login_env(root / "data", Path("unused"), users)
    del env["ERNIE_MODEL__ID"]  # the hub is out of reach and the HF cache empty: the offline demo model answers
    env |= {
        "ERNIE_ENGINE__NAME": "llama.cpp",
        "ERNIE_LLAMACPP__EXTRA_ARGS": json.dumps(["--log-prompts-dir", str(prompts)]),
        "ERNIE_DEMO__MAX_TOKENS": "48",
        "ERNIE_DEMO__TEMPERATURE": "0",  # greedy: the same answer for the same prompt on one CPU
        "ERNIE_TUNE__ENABLED": "false",  # the engine and the demo's one format are named: nothing to choose
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "HF_HOME": str(root / "hf"),
    }
    app = launch_app(env, root / "app.log")
    try:
        app.wait_ready(timeout=600)  # the answer check runs at every test run's first start: slow on a busy CPU
        yield Site(app, prompts)
    finally:
        app.stop()


async def attach(page: Any, name: str, body: str) -> None:
    """Attach a file as the page's attach button (📎) does."""
    await page.locator('input[type="file"]').first.set_input_files(
        files=[{"name": name, "mimeType": "text/markdown", "buffer": body.encode()}]
    )


async def ask(page: Any, site: Site, text: str) -> tuple[str, list[str]]:
    """Send `text` and wait for its reply to finish: (its text, the prompts the engine got meanwhile). The app's
    notices (a file added, the demo model's) come between replies: the reply is the next one with details."""
    before = await asyncio.to_thread(site.logged)
    finished = await page.locator(FINISHED).count()
    await send(page, text)
    await page.wait_for_function(
        "([sel, n]) => document.querySelectorAll(sel).length > n", arg=[FINISHED, finished], timeout=WAIT_MS
    )
    reply = page.locator(REPLY).filter(has=page.locator(DETAILS)).last
    text = str(await reply.evaluate(WITHOUT_ELEMENTS, f"{DETAILS}, {SOURCES}"))
    return text.strip(), await asyncio.to_thread(site.prompts_since, before)


async def source_opens(page: Any, n: int, label: str, marker: str) -> None:
    """The n-th sources under a reply name `label`, and a click on it shows the passage with `marker`."""
    sources = page.locator(SOURCES).nth(n)
    await sources.wait_for(timeout=WAIT_MS)
    assert label in await sources.inner_text()
    text = sources.locator(".reply-source-text").first
    assert not await text.is_visible(), "closed until clicked"
    await sources.locator("summary").first.click()
    assert shows(await text.inner_text(), marker)


async def test_a_document_answers_in_both_languages_with_its_source_for_its_owner_only(
    browser: Any, site: Site
) -> None:
    marker = new_markers(1)[0]
    alice = await (await browser.new_context(locale="en-US")).new_page()
    await sign_in(alice, site.app.url, "alice", PASSWORD)
    await attach(alice, "vault.md", f"# Vault\n\nThe vault code is {marker}.\n\n保险库的密码是 {marker}。\n")
    reply, prompts = await ask(alice, site, QUESTION)
    await alice.wait_for_selector('text=Added "vault.md" to your documents', timeout=WAIT_MS)
    assert len(prompts) == 1 and shows(prompts[0], marker), "the passage reached the engine's request"
    await source_opens(alice, 0, "[1] vault.md · Vault", marker)
    assert shows(reply, marker), f"the demo model's reply lacks the fact: {reply!r}"

    reply_zh, prompts = await ask(alice, site, QUESTION_ZH)
    assert len(prompts) == 1 and LEAD["zh"] in prompts[0]
    asked_zh = prompts[0].rsplit(LEAD["zh"], 1)[1]  # the new message, after the first turn
    assert shows(asked_zh, marker) and QUESTION_ZH in asked_zh
    await source_opens(alice, 1, "[1] vault.md · Vault", marker)
    assert shows(reply_zh, marker), f"the reply to the Chinese question lacks the fact: {reply_zh!r}"

    bob = await (await browser.new_context(locale="zh-CN")).new_page()
    await sign_in(bob, site.app.url, "bob", PASSWORD)
    _, prompts = await ask(bob, site, f"{QUESTION} {QUESTION_ZH}")
    assert len(prompts) == 1 and not shows(prompts[0], marker), "bob's request holds nothing of it"
    assert await bob.locator(SOURCES).count() == 0

    # alice's thread, reopened from the sidebar in a new page: its replies name their sources again
    again = await (await browser.new_context(locale="en-US")).new_page()
    await sign_in(again, site.app.url, "alice", PASSWORD)
    await again.locator("#thread-history").get_by_text(QUESTION).first.click()
    await again.wait_for_selector(f"{USER} >> text={QUESTION_ZH}", timeout=WAIT_MS)
    await source_opens(again, 1, "[1] vault.md · Vault", marker)
    assert await again.locator(SOURCES).count() == 2
