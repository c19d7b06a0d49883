"""What the browser tests do on the chat page: open it in a language, send a message, wait for a reply or a notice."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from playwright.async_api import TimeoutError as PlaywrightTimeoutError

from backend.chat.i18n import MESSAGES, lang_of
from tests.app_process import READY, REPLY, USER, RunningApp, start_app
from tests.deadlines import WAIT_MS
from tests.stub_engine import StubEngine
from tests.waiting import wait_until

LOCALES = ["en-US", "zh-CN"]
DETAILS = ".reply-details"  # the details element under every finished reply (public/elements/ReplyDetails.jsx)


@asynccontextmanager
async def app_with_stub_engine(
    data: Path, reply: str = "A reply from the fake engine.", ready: bool = True, **overrides: str
) -> AsyncIterator[tuple[RunningApp, StubEngine]]:
    """The app on a StubEngine (tests/stub_engine.py), with its data under `data`: ready to chat, or (ready=False)
    serving its page while the engine is not ready until the test says so (`engine.ready.set()`)."""
    with StubEngine(reply=reply, ready=ready) as engine:
        app = start_app(data, **engine.app_overrides(), **overrides)
        try:
            await asyncio.to_thread(app.wait_ready if ready else lambda: wait_until(app.answering, "the app's page"))
            yield app, engine
        finally:
            app.kill()


async def open_page(browser: Any, url: str, locale: str, ready: str = READY) -> Any:
    """A new page in a browser whose language is `locale`, once the chat's start has sent `ready`."""
    page = await (await browser.new_context(locale=locale)).new_page()
    await page.goto(url)
    await page.wait_for_selector("#chat-input", timeout=60_000)
    await page.wait_for_selector(ready, timeout=60_000)
    return page


async def sign_in(page: Any, url: str, name: str, password: str) -> None:
    """Log `name` in on the chat's login page at `url`, until the chat's start has sent its settings."""
    await page.goto(url)
    await page.wait_for_selector("#email", timeout=60_000)
    await page.fill("#email", name)
    await page.fill("#password", password)
    await page.click('button[type="submit"]')
    await page.wait_for_selector(READY, timeout=60_000)


async def open_workshop(browser: Any, url: str, locale: str) -> Any:
    """The template workshop of the app at `url` in a browser whose language is `locale`, once its page is ready."""
    page = await (await browser.new_context(locale=locale)).new_page()
    await page.goto(url + "/workshop")
    await page.wait_for_selector("body[data-ready=true]", timeout=60_000)
    return page


async def send(page: Any, text: str) -> None:
    """Type `text` in the chat's input and press Enter once the page's send button is active, as a person does;
    then wait until the page took it (its input empties).

    Chainlit's page takes no message while a task runs (from its task_start to its task_end): a reply's details show
    before its task has ended, and an edit's or a regenerate's task may end later still. Enter pressed meanwhile
    does nothing and the text stays in the input (nothing is lost: a person presses it again)."""
    await page.click("#chat-input")
    await page.keyboard.type(text)
    try:
        await page.wait_for_selector("#chat-submit:not([disabled])", timeout=WAIT_MS)
    except PlaywrightTimeoutError:
        raise AssertionError(f"the page's send button stayed off: {await page_state(page)}") from None
    await page.keyboard.press("Enter")
    try:
        await page.wait_for_function(f"() => ({INPUT_TEXT}).trim() === ''", timeout=SENT_MS)
    except PlaywrightTimeoutError:
        raise AssertionError(f"the page did not send {text!r} in {SENT_MS} ms: {await page_state(page)}") from None


async def wait_finished(page: Any, n: int) -> str:
    """The text of the n-th assistant message once its details show it finished (the details left out)."""
    reply = page.locator(REPLY).nth(n)
    try:
        await page.wait_for_selector(f"{REPLY} >> nth={n} >> {DETAILS}", timeout=WAIT_MS)
    except PlaywrightTimeoutError:
        raise AssertionError(f"reply {n} did not finish in {WAIT_MS} ms: {await page_state(page)}") from None
    return str(await reply.evaluate(WITHOUT_ELEMENTS, DETAILS)).strip()


SENT_MS = 15_000
INPUT_TEXT = (
    "(() => { const i = document.querySelector('#chat-input'); return i ? (i.value ?? i.innerText ?? '') : ''; })()"
)
# What the page shows, for a failure's message: every message's kind and start, the input, the stop button.
_PAGE_STATE = f"""([user, reply, details]) => ({{
  messages: [...document.querySelectorAll(`${{user}}, ${{reply}}`)].map(el =>
    (el.matches(user) ? "user: " : "reply: ") + (el.innerText || "").trim().slice(0, 60)
    + (el.matches(reply) && el.querySelector(details) ? " [finished]" : "")),
  input: {INPUT_TEXT},
  stop_button: !!document.querySelector('#stop-button'),
}})"""


async def page_state(page: Any) -> dict[str, Any]:
    """What the page shows now (see _PAGE_STATE); {"unreadable": why} when the page is gone."""
    try:
        return dict(await page.evaluate(_PAGE_STATE, [USER, REPLY, DETAILS]))
    except Exception as exc:  # a closed page: the failure's message says so instead
        return {"unreadable": str(exc)[:200]}


# An element's text without the elements a selector finds in it, its details (a copy is changed, never the page).
WITHOUT_ELEMENTS = """(el, details) => {
  const copy = el.cloneNode(true);
  copy.querySelectorAll(details).forEach(d => d.remove());
  document.body.appendChild(copy);
  const text = copy.innerText;
  copy.remove();
  return text;
}"""


async def details_of(page: Any, n: int) -> list[str]:
    """The items of the n-th assistant message's details, once it has them."""
    await page.wait_for_selector(f"{REPLY} >> nth={n} >> {DETAILS}", timeout=WAIT_MS)
    items = await page.locator(REPLY).nth(n).locator(f"{DETAILS} .reply-detail").all_inner_texts()
    return [item.strip().removeprefix("· ") for item in items]


async def wait_turn_over(page: Any, n: int) -> str:
    """The text of the n-th assistant message once the turn that sent it is over (the stop button has gone)."""
    await page.wait_for_function(
        "([sel, n]) => document.querySelectorAll(sel).length > n && !document.querySelector('#stop-button')",
        arg=[REPLY, n],
        timeout=WAIT_MS,
    )
    return str(await page.locator(REPLY).nth(n).inner_text())


def message_pattern(key: str, locale: str) -> str:
    """A regular expression (Python and JavaScript) for MESSAGES[key] in the language of `locale`, each number
    parameter ({elapsed:.0f}) captured as a group."""
    parts = re.split(r"\{\w+:\.0f\}", MESSAGES[key][lang_of(locale)])
    return r"(\d+)".join(re.escape(part) for part in parts)


# The number in the first assistant message matching a pattern (see message_pattern), once it is above `above`.
_NUMBER_SHOWN = """([sel, src, above]) => {
  const re = new RegExp(src);
  for (const el of document.querySelectorAll(sel)) {
    const m = (el.innerText || "").match(re);
    if (m && Number(m[1]) > above) return Number(m[1]);
  }
  return null;
}"""


async def number_shown(page: Any, pattern: str, above: float = -1) -> int:
    """Wait until an assistant message matches `pattern` with a number above `above`; return that number."""
    handle = await page.wait_for_function(_NUMBER_SHOWN, arg=[REPLY, pattern, above], timeout=WAIT_MS)
    return int(await handle.json_value())


async def matching(page: Any, pattern: str) -> int:
    """How many assistant messages match `pattern` now."""
    return int(
        await page.evaluate(
            "([sel, src]) => [...document.querySelectorAll(sel)].filter(el => new RegExp(src).test(el.innerText))"
            ".length",
            [REPLY, pattern],
        )
    )
