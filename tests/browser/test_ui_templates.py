"""Templates in the chat, in the page's language: the / menu lists them with their descriptions and picking one
answers that message with it; an unknown /name gets a message listing the templates (and reaches no model); the
settings selector shows the descriptions, its help line explains the current choice, and a change is acknowledged.

The engine is a StubEngine (tests/stub_engine.py): what the model was asked is read from its requests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from backend.chat.decision import COMMAND_REASON
from backend.chat.i18n import t
from backend.chat.render import localized, reason_text, settings_saved
from backend.config import ROOT
from backend.errors import CATALOG, lang_of
from backend.prompts.store import TemplateStore
from tests.app_process import READY, RunningApp
from tests.browser.pages import LOCALES, app_with_stub_engine, details_of, open_page, wait_finished, wait_turn_over
from tests.stub_engine import StubEngine

pytestmark = [pytest.mark.browser, pytest.mark.integration]

TEMPLATES = TemplateStore(ROOT / "prompts").describe()  # (name, description) in routing order
DESCRIPTIONS = dict(TEMPLATES)


@pytest_asyncio.fixture(scope="module")
async def chat(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[RunningApp, StubEngine]]:
    async with app_with_stub_engine(tmp_path_factory.mktemp("templates") / "data") as running:
        yield running


@pytest.mark.parametrize("locale", LOCALES)
async def test_the_slash_menu_lists_the_templates_and_a_pick_answers_with_it(browser, chat, locale: str) -> None:  # type: ignore[no-untyped-def]
    app, engine = chat
    page = await open_page(browser, app.url, locale)
    await page.click("#chat-input")
    await page.keyboard.type("/")
    menu = page.locator("[cmdk-item]")
    await menu.first.wait_for(timeout=60_000)
    shown = [" ".join(text.split()) for text in await menu.all_inner_texts()]
    assert shown == [f"{name} {localized(text, locale)}" for name, text in TEMPLATES]
    await page.keyboard.type("summ")
    await page.keyboard.press("Enter")  # picks the one command left
    await page.keyboard.type("Hello there")
    await page.keyboard.press("Enter")
    await wait_finished(page, 0)
    template, reason, *_ = await details_of(page, 0)
    assert (template, reason) == ("summary", reason_text(COMMAND_REASON, locale))
    asked = engine.conversations()[-1][-1]
    assert asked[0] == "user" and "Hello there" in asked[1] and asked[1] != "Hello there", "the summary prompt"


@pytest.mark.parametrize("locale", LOCALES)
async def test_an_unknown_slash_name_is_told_which_templates_exist(browser, chat, locale: str) -> None:  # type: ignore[no-untyped-def]
    app, engine = chat
    page = await open_page(browser, app.url, locale)
    asked = len(engine.requests)
    await page.click("#chat-input")
    await page.keyboard.type("/nosuchtemplate hello")
    await page.keyboard.press("Enter")
    text = await wait_turn_over(page, 0)
    message, hint = CATALOG["input.unknown_template"][lang_of(locale)]
    assert message.format(name="nosuchtemplate", known=", ".join(DESCRIPTIONS)) in text and hint in text, text
    assert len(engine.requests) == asked, "nothing reached the model"


def chainlit_text(locale: str, *keys: str) -> str:
    """One of Chainlit's own words on the page, from its translation of `locale` (.chainlit/translations)."""
    words: Any = json.loads((ROOT / ".chainlit" / "translations" / f"{locale}.json").read_text(encoding="utf-8"))
    for key in keys:
        words = words[key]
    return str(words)


async def settings_panel(page: Any) -> tuple[Any, str]:
    """Open the settings panel; (its dialog, the template selector's help line)."""
    await page.click(READY)
    dialog = page.locator("[role=dialog]")
    help_line = dialog.locator("#template + div")
    await help_line.wait_for(timeout=60_000)
    return dialog, " ".join((await help_line.inner_text()).split())


@pytest.mark.parametrize("locale", LOCALES)
async def test_the_selector_describes_the_templates_and_explains_the_choice(browser, chat, locale: str) -> None:  # type: ignore[no-untyped-def]
    app, _ = chat
    page = await open_page(browser, app.url, locale)
    dialog, help_line = await settings_panel(page)
    assert help_line == t("template_help_auto", locale)
    await dialog.locator("#template").click()
    options = [" ".join(text.split()) for text in await page.locator("[role=option]").all_inner_texts()]
    assert options == [t("template_auto", locale)] + [f"{name} · {localized(text, locale)}" for name, text in TEMPLATES]
    await page.locator("[role=option]").nth(1 + list(DESCRIPTIONS).index("summary")).click()
    await dialog.get_by_role("button", name=chainlit_text(locale, "common", "actions", "confirm"), exact=True).click()
    toast = page.locator("[data-sonner-toast]")
    await toast.first.wait_for(timeout=60_000)
    assert (await toast.first.inner_text()).strip() == settings_saved({"template": "summary"}, locale)
    _, help_line = await settings_panel(page)
    expected = t("template_help_chosen", locale, name="summary", description=localized(DESCRIPTIONS["summary"], locale))
    assert help_line == expected
