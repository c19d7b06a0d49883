"""The first page explains itself, in the page's language: the product's logo (light and dark) and favicon, what
answers (model · engine · device) and the engine's state while it starts, and starters that show what the
templates do. The first chat, opened while the engine starts, gets the demo model's notice with its first reply.

The first test's engine is a StubEngine (tests/stub_engine.py): the test decides when it is ready, so the page is
certain to see it starting. The second serves the offline demo model with llama.cpp, as `make run` does offline."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from backend.chat.i18n import MESSAGES, lang_of, t
from backend.chat.render import STARTERS
from backend.config import ROOT
from backend.errors import Phrase
from backend.models.resolve import DEMO_NAME
from tests.app_process import READY, REPLY, USER, start_app
from tests.browser.pages import DETAILS, LOCALES, app_with_stub_engine, details_of, send, wait_finished
from tests.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration]

STATUS = "#ernie-status"


def state_pattern(key: str, locale: str) -> str:
    return r"(\d+)".join(re.escape(part) for part in re.split(r"\{\w+:\.0f\}", MESSAGES[key][lang_of(locale)]))


async def shown(page, selector: str, pattern: str, above: int = -1) -> str:  # type: ignore[no-untyped-def]
    """The text of `selector` once it matches `pattern` (with its number, if any, above `above`)."""
    handle = await page.wait_for_function(
        """([sel, src, above]) => {
             const text = document.querySelector(sel)?.innerText || "";
             const m = text.match(new RegExp(src));
             return m && (m.length < 2 || Number(m[1]) > above) ? text : null;
           }""",
        arg=[selector, pattern, above],
        timeout=120_000,
    )
    return str(await handle.json_value())


async def replies_finished(page, count: int) -> None:  # type: ignore[no-untyped-def]
    """Wait until `count` replies have their details (finished), whichever notices came between them."""
    await page.wait_for_function(
        "([sel, n]) => document.querySelectorAll(sel).length >= n", arg=[DETAILS, count], timeout=180_000
    )


@pytest.mark.parametrize("locale", LOCALES)
async def test_the_first_page_says_what_answers_and_how_to_start(browser, tmp_path: Path, locale: str) -> None:  # type: ignore[no-untyped-def]
    # the engine is not ready until the test says so
    async with app_with_stub_engine(tmp_path / "data", ready=False) as (app, engine):
        page = await (await browser.new_context(locale=locale)).new_page()
        await page.goto(app.url)
        starting = state_pattern("state_starting", locale)
        first = int(re.search(starting, await shown(page, f"{STATUS} .ernie-state", starting)).group(1))  # type: ignore[union-attr]
        await shown(page, f"{STATUS} .ernie-state", starting, above=first)  # the seconds go by
        assert await page.inner_text(f"{STATUS} .ernie-serving") == "ERNIE-4.5-0.3B-PT · external"
        assert await page.inner_text(f"{STATUS} .ernie-tagline") == t("tagline", locale)
        engine.ready.set()
        await shown(page, f"{STATUS} .ernie-state", f"^{re.escape(t('state_ready', locale))}$")

        # the product's own logo (the page asks for the one of its theme), and favicon
        logo = await page.get_attribute("#welcome-screen img", "src")
        assert logo is not None and "/logo" in logo
        for theme in ("light", "dark"):
            served = await page.request.get(f"{app.url}/logo?theme={theme}")
            assert await served.body() == (ROOT / "public" / f"logo_{theme}.svg").read_bytes()
        icon = await page.get_attribute('link[rel="icon"]', "href")
        served = await page.request.get(app.url + str(icon))
        assert await served.body() == (ROOT / "public" / "favicon.svg").read_bytes()

        # the Readme panel in the page's language, from its own file (that Chainlit takes it, not its fallback to
        # chainlit.md: tests/unit/chat/test_readme.py)
        settings = await (await page.request.get(f"{app.url}/project/settings?language={locale}")).json()
        assert settings["markdown"] == (ROOT / f"chainlit_{locale}.md").read_text(encoding="utf-8")

        # one starter for each kind of template, in the page's language; a starter sends its message
        labels = [label.strip() for label in await page.locator("#starters button").all_inner_texts()]
        assert labels == [t(f"starter_{name}", locale) for name in STARTERS]
        await page.wait_for_selector(READY, timeout=60_000)
        await page.locator("#starters button").nth(STARTERS.index("summary")).click()
        await wait_finished(page, 0)
        assert (await details_of(page, 0))[0] == "summary"
        assert (await page.locator(USER).last.inner_text()).strip() == t("starter_summary_message", locale)


@pytest.mark.parametrize("locale", LOCALES)
async def test_the_first_chat_gets_the_demo_notice_with_its_first_reply(browser, tmp_path: Path, locale: str) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "data"
    # The hub is out of reach and the HF cache is empty: the demo model answers. The page opens as soon as the app
    # answers, most often while the engine still starts (whichever, the notice must come).
    app = start_app(data, engine__name="llama.cpp", HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(data / "hf"))
    try:
        await asyncio.to_thread(wait_until, app.answering, "the app's page")
        page = await (await browser.new_context(locale=locale)).new_page()
        await page.goto(app.url)
        await page.wait_for_selector(READY, timeout=60_000)
        assert await page.locator("#starters button").count() == len(STARTERS), "no message hides the starters"
        demo = t("serving_demo", locale, model=DEMO_NAME) + " · llama.cpp · CPU"
        await shown(page, f"{STATUS} .ernie-serving", f"^{re.escape(demo)}$")
        await send(page, "Hello")
        await replies_finished(page, 1)
        texts = await page.locator(REPLY).all_inner_texts()  # a "starting" notice first when the engine was starting
        demo_parts = [part.strip() for part in MESSAGES["demo"][lang_of(locale)].split("{note}")]
        told = [i for i, text in enumerate(texts) if all(part in text for part in demo_parts)]
        assert len(told) == 1 and told[0] == len(texts) - 2, texts  # the notice, then the reply
        why = Phrase("demo.hub", model="baidu/ERNIE-4.5-0.3B-PT", demo=DEMO_NAME).text(locale)
        assert why in texts[told[0]], "why the demo answers, in the page's language"
        await send(page, "And goodbye")
        await replies_finished(page, 2)
        assert await page.locator(REPLY).count() == len(texts) + 1, "the chat is told once"
    finally:
        app.kill()
