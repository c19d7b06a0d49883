"""A reply's details (template, why it was chosen, time to first token, speed, token counts) sit under the reply in
the page's language, out of its text.

The engine is a StubEngine (tests/stub_engine.py): its reply and its usage (1 prompt token, one token a word) are
known, so the text and the counts shown are facts to compare."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from backend.chat.i18n import MESSAGES, lang_of, t
from backend.chat.render import localized, reason_text
from backend.prompts.schema import Reason
from tests.app_process import REPLY
from tests.browser.pages import DETAILS, LOCALES, app_with_stub_engine, details_of, open_page, send, wait_finished

pytestmark = [pytest.mark.browser, pytest.mark.integration]

REPLY_TEXT = "Three short sentences of summary."
SUMMARY = "总结：今天下雨，我们在家里读书，晚上一起做饭。"  # routed by the summary template's keyword "总结"


def pattern(key: str, locale: str) -> str:
    """MESSAGES[key] as a regular expression, each {name:.Nf} parameter a number."""
    parts = re.split(r"\{\w+:\.\d+f\}", MESSAGES[key][lang_of(locale)])
    return r"\d+(?:\.\d+)?".join(re.escape(part) for part in parts)


@pytest.mark.parametrize("locale", LOCALES)
async def test_details_under_the_reply_in_the_page_language(browser, tmp_path: Path, locale: str) -> None:  # type: ignore[no-untyped-def]
    async with app_with_stub_engine(tmp_path / "data", reply=REPLY_TEXT) as (app, _):
        page = await open_page(browser, app.url, locale)
        before = await page.locator(REPLY).count()
        await send(page, SUMMARY)
        text = await wait_finished(page, before)
        items = await details_of(page, before)
        title = await page.locator(REPLY).nth(before).locator(DETAILS).get_attribute("title")
    assert text == REPLY_TEXT, "the reply's text is the model's alone"
    template, reason, ttft, speed, tokens = items
    assert (template, reason) == ("summary", reason_text(Reason("keyword", "总结"), locale))
    assert re.fullmatch(pattern("detail_ttft", locale), ttft), ttft
    assert re.fullmatch(pattern("detail_speed", locale), speed), speed
    assert tokens == t("detail_tokens", locale, prompt=1, output=len(REPLY_TEXT.split(" ")))
    description = (
        "总结：最多三句短句概括要点 / Summary: the gist in at most three short sentences"  # prompts/summary.yaml
    )
    assert title == localized(description, locale) and title != description
