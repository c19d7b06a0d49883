"""Feedback on a reply, with history on (login): thumbs up or down with an optional comment, in English and
Chinese; kept with the conversation (the thread's feedbacks table) and counted in /metrics by rating and comment.
Without history (no login) Chainlit offers no feedback: it has nowhere to keep it (tests/browser/
test_ui_reply_actions.py).

The engine is a StubEngine (tests/stub_engine.py); the conversations go to the app's SQLite file."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from backend.accounts.passwords import hash_password
from backend.accounts.users import write_users_file
from tests.app_process import READY, REPLY, RunningApp
from tests.browser.pages import LOCALES, app_with_stub_engine, send, wait_finished
from tests.sqlite_file import opened
from tests.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration]

ASSISTANT = '.step[data-step-type="assistant_message"]'
REPLY_TEXT = "A reply from the fake engine."


def rated(app: RunningApp, rating: str, comment: str) -> float:
    """The app's count of ratings `rating` with (comment "yes") or without a comment, from its /metrics."""
    text = urllib.request.urlopen(app.url + "/metrics", timeout=5).read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "ernie_feedback_total" and sample.labels == {"rating": rating, "comment": comment}
    )


def kept(database: Path) -> list[tuple[str, str, int, str | None]]:
    """(thread, rated reply's text, value, comment) of each feedback kept, the replies in their order. Chainlit's
    page rates the run (on_message) that sent a reply: the reply is that run's step."""
    query = """SELECT r."threadId", r.output, f.value, f.comment FROM feedbacks f
               JOIN steps r ON r."parentId" = f."forId" AND r.type = 'assistant_message' ORDER BY r."createdAt" ASC"""
    with opened(database) as db:
        return [tuple(row) for row in db.execute(query)]


@pytest.mark.parametrize("locale", LOCALES)
async def test_a_rating_with_a_comment_is_kept_with_the_thread_and_counted(
    browser, tmp_path: Path, locale: str
) -> None:  # type: ignore[no-untyped-def]
    users = tmp_path / "users.yaml"
    write_users_file(users, {"alice": hash_password("alice-password")})
    data = tmp_path / "data"
    login = {"auth__enabled": "true", "auth__users_file": str(users)}
    async with app_with_stub_engine(data, reply=REPLY_TEXT, **login) as (app, _):
        page = await (await browser.new_context(locale=locale)).new_page()
        await page.goto(app.url)
        await page.wait_for_selector("#email", timeout=60_000)
        await page.fill("#email", "alice")
        await page.fill("#password", "alice-password")
        await page.click('button[type="submit"]')
        await page.wait_for_selector(READY, timeout=60_000)
        await send(page, "Hello")
        await wait_finished(page, 0)
        await send(page, "Tell me more")
        await wait_finished(page, 1)
        replies = page.locator(ASSISTANT)

        await replies.nth(0).locator("button:has(svg.lucide-thumbs-up)").click()
        await page.fill("[role=dialog] textarea", "Clear and short")
        await page.click("#submit-feedback")
        await asyncio.to_thread(wait_until, lambda: rated(app, "up", "yes") == 1, "the rating counted", 60)
        await replies.nth(1).locator("button:has(svg.lucide-thumbs-down)").click()
        await page.click("#submit-feedback")  # no comment
        await asyncio.to_thread(wait_until, lambda: rated(app, "down", "no") == 1, "the rating counted", 60)
        assert await page.locator(REPLY).count() == 2
    feedbacks = kept(data / "chat.db")
    assert [row[1:] for row in feedbacks] == [(REPLY_TEXT, 1, "Clear and short"), (REPLY_TEXT, 0, None)], feedbacks
    assert feedbacks[0][0] == feedbacks[1][0], "both with the one thread"
