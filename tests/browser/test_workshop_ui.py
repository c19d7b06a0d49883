"""The template workshop (/workshop) in headless Chromium, in English and Chinese, on the real app and engine (llama.cpp
serving the tiny SentencePiece ERNIE model, which starts in seconds: routing by the templates' rules is on, as with the
real model; what the engine is does not matter to the workshop, whose preview is the app's own).

An editor on the app's own machine creates a template, sees check-prompts' message for a wrong value and fixes it
(in the form and in the YAML view), previews the routing of a message (their template, then another one of higher
priority winning), tries the draft against the engine (its counters show the request), saves it, and the chat routes
the next message to it without a restart (the reply's details name it); then saves a second version and restores
the first. A second editor saving over a version that changed meanwhile gets the conflict message. The model's
words are never looked at. With login on, only editors get the workshop: others see why (in their language)."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend.accounts.passwords import hash_password
from backend.accounts.users import write_users_file
from backend.chat.render import reason_text
from backend.config import ROOT
from backend.errors import render
from backend.prompts.schema import Reason, display_path
from tests.app_process import CHROMIUM, REPLY, RunningApp, start_app
from tests.browser.pages import LOCALES, WAIT_MS, details_of, open_page, open_workshop, send, sign_in
from tests.stub_engine import StubEngine
from tests.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration]


@dataclass
class Site:
    app: RunningApp
    prompts: Path


@pytest.fixture(scope="module")
def site(spm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: apt-get install -y chromium (make browser-deps does it)")
    root = tmp_path_factory.mktemp("workshop-ui")
    prompts = Path(shutil.copytree(ROOT / "prompts", root / "prompts"))
    app = start_app(
        root / "data",
        engine__name="llama.cpp",
        model__id=str(spm_model),
        chat__max_tokens="16",
        paths__prompts_dir=str(prompts),
    )
    try:
        app.wait_ready()
        yield Site(app, prompts)
    finally:
        app.kill()


async def problems(page: Any) -> list[str]:
    return [text.strip() for text in await page.locator("#problems li.problem").all_inner_texts()]


async def wait_problem(page: Any, words: str) -> str:
    """The problem line (as check-prompts prints it) once one holds `words`."""
    item = page.locator("#problems li.problem", has_text=words)
    await item.wait_for(timeout=WAIT_MS)
    return str(await item.inner_text()).strip()


async def wait_clean(page: Any) -> None:
    await page.wait_for_selector('#problems-box[data-count="0"]', timeout=WAIT_MS)


async def wait_outcome(page: Any, outcome: str, picked: str) -> None:
    await page.wait_for_selector(f'#routing-outcome[data-outcome="{outcome}"][data-picked="{picked}"]', timeout=WAIT_MS)


async def wait_status(page: Any, kind: str, before: str) -> str:
    """The status line's text once it is of `kind` and differs from `before`."""
    await page.wait_for_function(
        "([kind, before]) => { const el = document.querySelector('#status-message');"
        " return el && !el.hidden && el.dataset.kind === kind && el.textContent !== before; }",
        arg=[kind, before],
        timeout=WAIT_MS,
    )
    return str(await page.locator("#status-message").inner_text())


async def status_text(page: Any) -> str:
    return str(await page.evaluate("document.querySelector('#status-message').textContent"))


async def chat_details(browser: Any, site: Site, locale: str, text: str) -> list[str]:
    """The details of the reply to `text` sent in a new chat: the template that answered, why, the counts."""
    page = await open_page(browser, site.app.url, locale)
    before = await page.locator(REPLY).count()
    await send(page, text)
    return await details_of(page, before)


def template_text(site: Site, stem: str) -> str:
    return (site.prompts / f"{stem}.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize("locale", LOCALES)
async def test_create_check_preview_try_save_use_restore(browser, site: Site, locale: str) -> None:  # type: ignore[no-untyped-def]
    stem = f"poem-{uuid.uuid4().hex[:6]}"
    keyword = f"qz{uuid.uuid4().hex[:6]}"
    page = await open_workshop(browser, site.app.url, locale)

    # a new template, from the form
    await page.fill("#new-stem", stem)
    await page.click("#new-button")
    await page.wait_for_selector(f'#editor-title:text-is("{stem}")')
    await wait_clean(page)
    await page.fill("#field-description", "诗：写一首短诗 / Poem: a short poem")
    await page.fill("#field-keywords", keyword)
    await page.fill("#field-user", "Poem one:\n{input}")

    # a wrong value: check-prompts' own line (file, line, field, what to do); fixing it clears it
    await page.fill("#field-temperature", "5")
    path = display_path(site.prompts / f"{stem}.yaml")
    line = await wait_problem(page, 'field "temperature"')
    assert line.startswith(f"{path}, line ") and line.endswith(
        'field "temperature": must be a number between 0 and 2 (got 5)'
    ), line
    assert await page.locator('.field[data-field="temperature"].invalid').count() == 1
    await page.fill("#field-temperature", "0.5")
    await wait_clean(page)

    # the same in the YAML view: a misspelt field, then fixed
    await page.click("#view-yaml")
    await page.wait_for_selector("#yaml-view:not([hidden])")
    yaml_text = await page.input_value("#yaml-text")
    assert f"keywords:\n- {keyword}\n" in yaml_text and "temperature: 0.5" in yaml_text
    await page.fill("#yaml-text", yaml_text.replace("temperature: 0.5", "temprature: 0.5"))
    assert 'did you mean "temperature"?' in await wait_problem(page, 'field "temprature"')
    await page.fill("#yaml-text", yaml_text)
    await wait_clean(page)
    await page.click("#view-form")
    await page.wait_for_selector("#form-view:not([hidden])")
    assert await page.input_value("#field-temperature") == "0.5"

    # preview: the draft catches its keyword; writing (priority 10) catches 写 first while the draft has priority 5
    await page.fill("#sample-message", f"{keyword} about the sea")
    await wait_outcome(page, "draft", stem)
    assert await page.inner_text("#rendered-user") == f"Poem one:\n{keyword} about the sea"
    await page.fill("#sample-message", f"写一首诗 {keyword}")
    await wait_outcome(page, "other_first", "writing")
    assert await page.locator("#routing-table tr.draft td").first.inner_text() == stem
    await page.fill("#field-priority", "50")
    await wait_outcome(page, "draft", stem)

    # try the draft against the engine: a real request (its prompt tokens counted), nothing saved
    tokens_before = await asyncio.to_thread(site.app.engine_metric, "prompt_tokens")
    await page.click("#try-button")
    await page.wait_for_selector("#try-draft[data-state=done]", timeout=WAIT_MS)
    await page.wait_for_selector("#try-saved[data-state=error]", timeout=WAIT_MS)  # not saved yet: nothing to try
    await asyncio.to_thread(
        wait_until, lambda: site.app.engine_metric("prompt_tokens") > tokens_before, "the engine to count the try"
    )
    assert not (site.prompts / f"{stem}.yaml").exists()

    # save; the chat routes to it on the next message, no restart
    await page.fill("#save-note", "first")
    await page.click("#save-button")
    await wait_status(page, "ok", "")
    await page.wait_for_selector('#versions li.version[data-number="1"]')
    assert "Poem one:" in template_text(site, stem)
    details = await chat_details(browser, site, locale, f"{keyword} about the moon")
    assert details[:2] == [stem, reason_text(Reason("keyword", keyword), locale)], details

    # a second version, then the first one restored in one click
    shown = await status_text(page)
    await page.fill("#field-user", "Poem two:\n{input}")
    await wait_clean(page)
    await page.click("#save-button")
    await wait_status(page, "ok", shown)
    await page.wait_for_selector('#versions li.version[data-number="2"]')
    assert "Poem two:" in template_text(site, stem)
    await page.click('#versions li.version[data-number="1"] .diff-button')
    await page.wait_for_selector("#diff-text .removed", timeout=WAIT_MS)
    assert "Poem one:" in await page.inner_text("#diff-text .removed >> nth=-1")
    shown = await status_text(page)
    await page.click('#versions li.version[data-number="1"] .restore-button')
    await wait_status(page, "ok", shown)
    await page.wait_for_selector('#versions li.version[data-number="3"]')
    assert await page.input_value("#field-user") == "Poem one:\n{input}"
    assert "Poem one:" in template_text(site, stem)


@pytest.mark.parametrize("locale", LOCALES)
async def test_a_second_editor_gets_the_conflict_message(browser, site: Site, locale: str) -> None:  # type: ignore[no-untyped-def]
    stem = f"shared-{uuid.uuid4().hex[:6]}"
    text = f"name: {stem}\ndescription: one\nuser: '{{input}}'\n"
    async with httpx.AsyncClient(base_url=site.app.url, trust_env=False) as http:
        created = await http.post("/workshop/api/templates", json={"stem": stem, "yaml": text})
        assert created.status_code == 201, created.text
    first, second = (
        await open_workshop(browser, site.app.url, locale),
        await open_workshop(browser, site.app.url, locale),
    )
    for page in (first, second):
        await page.click(f'.template-row[data-stem="{stem}"]')
        await page.wait_for_selector('#versions li.version[data-number="1"]')

    await second.fill("#field-description", "the second editor's")
    await wait_clean(second)
    await second.click("#save-button")
    await wait_status(second, "ok", "")
    await first.fill("#field-description", "the first editor's")
    await wait_clean(first)
    await first.click("#save-button")
    shown = await wait_status(first, "conflict", "")

    before, after = render("workshop.conflict", locale, {"name": stem, "who": "local", "when": "\0"})[0].split("\0")
    assert before in shown and after in shown, shown
    assert render("workshop.conflict", locale, {})[1] in shown  # what to do
    assert "the second editor's" in template_text(site, stem), "nothing was overwritten"
    await first.wait_for_selector('#versions li.version[data-number="2"]')  # the newer version is listed
    await first.wait_for_selector("#diff-text .added", timeout=WAIT_MS)  # and what to merge: theirs -> this draft
    assert "the second editor's" in await first.inner_text("#diff-text .removed >> nth=-1")
    assert "the first editor's" in await first.inner_text("#diff-text .added >> nth=-1")


PASSWORD = "workshop-password"


@pytest.fixture(scope="module")
def login_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApp]:
    """The app with login on (ed is an editor, uma a user), answering through a StubEngine."""
    root = tmp_path_factory.mktemp("workshop-login")
    users = root / "users.yaml"
    write_users_file(users, {"ed": hash_password(PASSWORD), "uma": hash_password(PASSWORD)}, {"ed": "editor"})
    prompts = Path(shutil.copytree(ROOT / "prompts", root / "prompts"))
    with StubEngine() as engine:
        app = start_app(root / "data", auth__enabled="true", auth__users_file=str(users),
                        paths__prompts_dir=str(prompts), **engine.app_overrides())  # fmt: skip
        try:
            app.wait_ready()
            yield app
        finally:
            app.stop()


async def workshop_as(browser: Any, app: RunningApp, locale: str, name: str | None) -> Any:
    """The workshop page of a browser where `name` logged in on the chat's login page (None: nobody)."""
    page = await (await browser.new_context(locale=locale)).new_page()
    if name is not None:
        await sign_in(page, app.url, name, PASSWORD)
    await page.goto(app.url + "/workshop")
    await page.wait_for_selector("#access-denied:not([hidden]), body[data-ready=true]", timeout=60_000)
    return page


@pytest.mark.parametrize("locale", LOCALES)
async def test_with_login_only_editors_get_the_workshop(browser, login_site: RunningApp, locale: str) -> None:  # type: ignore[no-untyped-def]
    nobody = await workshop_as(browser, login_site, locale, None)
    assert await nobody.inner_text("#access-text") == render("workshop.login_needed", locale, {})[0]
    assert await nobody.is_visible("#login-link") and not await nobody.is_visible("#workshop")

    user = await workshop_as(browser, login_site, locale, "uma")
    assert (
        await user.inner_text("#access-text")
        == render("workshop.not_editor", locale, {"name": "uma", "role": "user"})[0]
    )
    assert "--role editor" in await user.inner_text("#access-hint")
    assert not await user.is_visible("#login-link") and not await user.is_visible("#workshop")

    editor = await workshop_as(browser, login_site, locale, "ed")
    assert await editor.is_visible("#workshop") and not await editor.is_visible("#access-denied")
    assert "ed" in await editor.inner_text("#who") and "editor" in await editor.inner_text("#who")
    assert await editor.locator('.template-row[data-stem="writing"]').count() == 1
