"""Chainlit hooks of the ERNIE chat service: they render what backend.chat.ChatService does, and decide nothing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import chainlit as cl
from chainlit.chat_context import chat_context
from chainlit.data.base import BaseDataLayer
from chainlit.input_widget import Select, Slider
from chainlit.types import ThreadDict
from chainlit.utils import utc_now

from backend.accounts.login import setup_login
from backend.chat.i18n import describe, t
from backend.chat.render import details_element, notice_text, reply_text, starters, wait_text
from backend.chat.request import SETTING_RANGES
from backend.chat.service import ChatService
from backend.chat.turn import ChatSession, Done, EngineWait, Event, Text
from backend.config import load_config
from backend.errors import ConfigError
from backend.logs import setup_logging
from backend.ops import metrics, page, web
from backend.storage.persistence import Persistence
from backend.storage.resume import history_from_thread, turn_metadata

log = logging.getLogger("app")
CHAINLIT_STOP_NOTICE = "Task manually stopped."  # chainlit/socket.py's stop handler sends it
SERVICE: ChatService | None = None
STARTUP_ERROR: ConfigError | None = None
# Decided at import: Chainlit asks whether a login page is needed right after importing this file.
ACCOUNTS = setup_login()
PERSISTENCE = Persistence()

if ACCOUNTS is not None:

    @cl.password_auth_callback
    async def password_login(username: str, password: str) -> cl.User | None:
        assert ACCOUNTS is not None
        name = await ACCOUNTS.login(username, password)
        return cl.User(identifier=name, metadata={"provider": "password"}) if name else None


@cl.data_layer
def data_layer() -> BaseDataLayer | None:
    return PERSISTENCE.layer()  # None (no history) until startup opened the database, or if it failed


def _lang() -> str:
    return cl.context.session.language or "en-US"


async def _say(text: str) -> None:
    await cl.Message(content=text, author="system").send()


@cl.on_app_startup
async def startup() -> None:
    global SERVICE, STARTUP_ERROR
    setup_logging()
    try:
        SERVICE = ChatService.from_config(load_config(), recorder=metrics.METRICS)
    except ConfigError as exc:
        STARTUP_ERROR = exc
        log.error("%s", exc)
        return
    await PERSISTENCE.open(SERVICE.cfg, login=ACCOUNTS is not None)
    web.install_routes(SERVICE)
    page.install_page(SERVICE)
    metrics.watch(SERVICE.supervisor)
    SERVICE.start()


@cl.on_app_shutdown
async def shutdown() -> None:
    if SERVICE is not None:
        await SERVICE.stop()


async def _open(session: ChatSession | None, greet: bool) -> None:
    """Keep the chat's session and show what it should know first (or why the service is down)."""
    cl.user_session.set("chat", session)
    cl.user_session.set("storage_mark", PERSISTENCE.mark())
    if SERVICE is None or session is None:
        await _say(t("error", _lang(), error=describe(STARTUP_ERROR, _lang())))
        return
    await _send_settings(session)
    if greet:  # the demo model's notice comes with the first reply: a message here would hide the starters
        if news := SERVICE.template_news(session):
            await _say(notice_text(news, _lang()))
        await _show_storage_problem()


@cl.set_starters
async def first_page_starters(user: cl.User | None, language: str | None = None) -> list[cl.Starter]:
    return [cl.Starter(label=label, message=text) for label, text in starters(language or "en-US")]


@cl.on_chat_start
async def chat_start() -> None:
    metrics.chat_started(cl.context.session.id)
    await _open(SERVICE.new_session() if SERVICE else None, greet=True)


@cl.on_chat_resume
async def chat_resume(thread: ThreadDict) -> None:
    saved = cl.context.session.chat_settings or {}
    await _open(SERVICE.resumed_session(history_from_thread(thread), saved) if SERVICE else None, greet=False)


@cl.on_stop
async def stopped() -> None:
    """Chainlit says "Task manually stopped." in English: the stopped reply says it in the user's language."""
    for message in reversed(chat_context.get()):
        if message.content == CHAINLIT_STOP_NOTICE:
            await message.remove()
            return


@cl.on_chat_end
async def chat_end() -> None:
    metrics.chat_ended(cl.context.session.id)


async def _send_settings(session: ChatSession) -> None:
    assert SERVICE is not None
    lang, settings = _lang(), session.settings
    names = ["auto", *SERVICE.templates.names()]
    widgets: list[Slider | Select] = [
        Slider(id=key, label=t(f"setting_{key}", lang), initial=getattr(settings, key), min=lo, max=hi, step=step)
        for key, (lo, hi, step) in SETTING_RANGES.items()
    ]
    chosen = settings.template if settings.template in names else "auto"
    widgets.append(
        Select(id="template", label=t("setting_template", lang), values=names, initial_value=chosen,
               description=t("template_auto", lang))
    )  # fmt: skip
    await cl.ChatSettings(widgets).send()


@cl.on_settings_update
async def settings_update(values: dict) -> None:
    if SERVICE is not None and cl.user_session.get("chat") is not None:
        SERVICE.update_settings(cl.user_session.get("chat"), values)


async def _show_storage_problem() -> None:
    """Tell the user once when conversations cannot be saved (the chat goes on without history)."""
    problem = PERSISTENCE.news(cl.user_session.get("storage_mark"))
    if problem is not None:
        await _say(t("storage_failed", _lang(), error=describe(problem, _lang())))


@cl.on_message
async def on_message(message: cl.Message) -> None:
    session: ChatSession | None = cl.user_session.get("chat")
    if SERVICE is None or session is None:
        await _say(t("error", _lang(), error=describe(STARTUP_ERROR, _lang())))
        return
    async with session.lock:  # one reply at a time per chat: rapid sends queue up
        await _answer(session, message.content or "", message.command)


async def _answer(session: ChatSession, text: str, command: str | None = None) -> None:
    assert SERVICE is not None
    page = _Page(_lang(), SERVICE.describe)
    turn = SERVICE.reply(session, text, command)
    try:
        async for event in turn:
            await page.show(event)
    except asyncio.CancelledError as stop:
        if turn.ag_frame is None:  # the stop landed inside the turn, before any reply: say so, nothing to finish
            await _say(t("stopped", page.lang))
            return
        # The stop landed while the page was being updated: the turn ends as stopped (the request is aborted).
        await page.show(await turn.athrow(stop))
    await _show_storage_problem()


class _Page:
    """One turn on the page: the engine notice (sent once, then updated) and the streamed reply."""

    def __init__(self, lang: str, describe: Callable[[str], str]) -> None:
        self.lang, self.describe = lang, describe
        self.note: cl.Message | None = None
        # A streamed message gets no time of its own (it is never send()): saved without one, it would sort first.
        self.reply = cl.Message(content="", created_at=utc_now())

    async def show(self, event: Event) -> None:
        if isinstance(event, EngineWait):
            if self.note is None and event.state != "ready":  # "ready" only updates a notice already shown
                self.note = cl.Message(content=wait_text(event, self.lang), author="system")
                await self.note.send()
            elif self.note is not None:
                self.note.content = wait_text(event, self.lang)
                await self.note.update()
        elif isinstance(event, Text):
            await self.reply.stream_token(event.text)
        elif isinstance(event, Done):
            self.reply.content = reply_text(event, self.lang)
            props, self.reply.metadata = details_element(event, self.lang, self.describe(event.template))
            if event.text:  # the turn as the model saw it: a resumed thread rebuilds the history from these
                self.reply.metadata |= turn_metadata(event.user_text, event.text)
            await (self.reply.update() if event.text else self.reply.send())
            # last: the details under the reply tell the page (and the tests) that the reply is finished
            await cl.CustomElement(name="ReplyDetails", props=props, display="inline").send(
                self.reply.id, persist=False
            )
        else:
            await _say(notice_text(event, self.lang))
