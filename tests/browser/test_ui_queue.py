"""A chat that waits in line for the engine shows its place and expected wait in the page's language, updates it,
and can be stopped while it waits (it never reaches the engine, and its place in line is freed).

The engine is a StubEngine (tests/stub_engine.py) with one place (server.places 1) that holds the first reply's
request until the test releases it, so the second chat is certain to wait. The line itself is proven against the
real engine in tests/integration/test_admission.py."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from backend.catalogue import CATALOG
from backend.chat.i18n import MESSAGES, lang_of
from tests.app_process import REPLY
from tests.browser.pages import LOCALES, app_with_stub_engine, open_page, send, wait_finished, wait_turn_over
from tests.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def queued_pattern(locale: str, place: int) -> str:
    """The start of the "number N in line" notice in the language of `locale`, up to its place."""
    return re.escape(MESSAGES["queued"][lang_of(locale)].split("{place}")[0]) + str(place)


@pytest.mark.parametrize("locale", LOCALES)
async def test_a_chat_waiting_in_line_shows_its_place_and_can_be_stopped_while_it_waits(
    browser, tmp_path: Path, locale: str
) -> None:  # type: ignore[no-untyped-def]
    async with app_with_stub_engine(tmp_path / "data", server__places="1") as (app, engine):
        first = await open_page(browser, app.url, locale)
        second = await open_page(browser, app.url, locale)
        engine.hold_path = "/v1/chat/completions"
        asked = len(engine.requests)  # a held request is recorded once it is let go
        await send(first, "Hello")
        assert await asyncio.to_thread(engine.held.wait, 180), "the first reply holds the engine's one place"
        before = await second.locator(REPLY).count()
        await send(second, "Hello too")
        notice = f"{REPLY} >> text=/{queued_pattern(locale, 1)}/"
        await second.wait_for_selector(notice, timeout=60_000)
        assert app.health()["line"] == {**app.health()["line"], "running": 1, "waiting": 1}
        await second.click("#stop-button")
        await wait_turn_over(second, before)
        # the page's turn ends as the stop is handled; the ticket leaves the line as the task's cancellation unwinds
        await asyncio.to_thread(
            wait_until, lambda: app.health()["line"]["waiting"] == 0 or None, "the stopped chat left the line", 10
        )
        engine.hold_path = None
        engine.release.set()
        await wait_finished(first, 0)
        assert len(engine.requests) == asked + 1, "only the first chat reached the engine: the one stopped in line not"
        count = await second.locator(REPLY).count()
        await send(second, "Hello again")  # its place was freed: it is answered at once
        await wait_finished(second, count)
        assert len(engine.requests) == asked + 2


@pytest.mark.parametrize("locale", LOCALES)
async def test_a_chat_beyond_the_lines_bound_is_told_the_server_is_full_and_when_to_try_again(
    browser, tmp_path: Path, locale: str
) -> None:  # type: ignore[no-untyped-def]
    """One place and no room in line (admission.queue_max 0): a second chat is told at once, in the page's language,
    that the server is busy and in how many seconds to try again; its message never reaches the engine, and sent
    again once the place is free it is answered."""
    async with app_with_stub_engine(tmp_path / "data", server__places="1", admission__queue_max="0") as (app, engine):
        first = await open_page(browser, app.url, locale)
        second = await open_page(browser, app.url, locale)
        engine.hold_path = "/v1/chat/completions"
        asked = len(engine.requests)
        await send(first, "Hello")
        assert await asyncio.to_thread(engine.held.wait, 180), "the first reply holds the engine's one place"
        await send(second, "Hello too")
        full = CATALOG["admission.full"]
        message, hint = full.zh if lang_of(locale) == "zh" else full.en
        busy, again = message.split("{waiting}")[0].rstrip("（( "), hint.split("{retry_s}")[0]
        told = re.escape(busy) + r"[\s\S]*" + re.escape(again)
        await second.wait_for_selector(f"text=/{told}\\s*\\d+/", timeout=60_000)
        assert app.health()["line"]["refused"] >= 1
        engine.hold_path = None
        engine.release.set()
        await wait_finished(first, 0)
        assert len(engine.requests) == asked + 1, "the chat told the server is full never reached the engine"
        count = await second.locator(REPLY).count()
        await send(second, "Hello again")
        await wait_finished(second, count)
        assert len(engine.requests) == asked + 2
