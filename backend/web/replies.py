"""A chat's replies on Chainlit's pages: ask one, follow it from any page of its owner, stop it, come back to it.

The hooks (backend.web.hooks) call these. The reply itself lives in backend.chat.live (its own task, not the page's);
each page that shows it has a ReplyView (backend.web.view). Coming back: with login, a reloaded page or a second tab
opens the thread (Chainlit resumes it) and follows the reply from the text so far; a page whose websocket came back
after a cut catches up. Without login nothing is saved: a reload of the same browser tab (its id kept in the tab's
sessionStorage and sent as a cookie, public/ernie.js) gets the tab's chat back from memory, for `tab_memory_s` after
the tab last had it, and only in this process (a restart forgets it)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from typing import Any

import chainlit as cl
from chainlit.chat_context import chat_context, chat_contexts
from chainlit.context import init_ws_context
from chainlit.data import get_data_layer

from backend.chat.i18n import t
from backend.chat.live import LiveReplies, LiveReply
from backend.chat.render import DETAILS_KEY, SOURCES_KEY
from backend.chat.saved import LIVE_KEY, live_steps, step_metadata
from backend.chat.sources import user_owner
from backend.chat.turn import ChatSession, Event
from backend.config import ChatDefaults
from backend.web.view import ReplyView, send_under

log = logging.getLogger(__name__)

TAB_COOKIE = "ernie_tab"  # public/ernie.js: the browser tab's own id


def tab_id(session: Any = None) -> str | None:
    """The id of the browser tab (public/ernie.js) of this page (or of a Chainlit `session`), if it sent one."""
    try:
        cookie = SimpleCookie((session or cl.context.session).environ.get("HTTP_COOKIE", ""))
    except CookieError:
        return None
    morsel = cookie.get(TAB_COOKIE)
    return morsel.value if morsel is not None and 16 <= len(morsel.value) <= 64 else None


def owner_of(session: Any, login: bool) -> str:
    """Who a Chainlit session is: the user with login; without, the browser tab (or, lacking its id, the session)."""
    if login and session.user is not None:
        return user_owner(session.user.identifier)
    tab = tab_id(session)
    return f"tab:{tab}" if tab else f"session:{session.id}"


@dataclass
class Tab:
    """What a browser tab without login had: its chat, the thread its replies run under, the page that last had it."""

    chat: ChatSession
    key: str
    messages: list[cl.Message]  # Chainlit's messages of the page that last showed it (held: Chainlit drops its own)
    seen: float  # time.monotonic() when a page last had it


class Replies:
    """The chat's live replies, the pages that follow them and (without login) the tabs' chats."""

    def __init__(self, cfg: ChatDefaults, describe: Callable[[str], str], login: bool) -> None:
        self.live = LiveReplies(cfg.detached_reply_s)
        self.tab_memory_s = cfg.tab_memory_s
        self.describe, self.login = describe, login
        self.tabs: dict[str, Tab] = {}

    def owner(self) -> str:
        """Who this page is: the user with login; without, the browser tab (or, lacking its id, the page itself)."""
        return owner_of(cl.context.session, self.login)

    def key(self) -> str:
        """The thread this page's replies run under (a reloaded tab without login goes on under its first one)."""
        return str(cl.user_session.get("reply_key") or cl.context.session.thread_id)

    async def answer(self, chat: ChatSession, turn: AsyncGenerator[Event, None], asked: str, lang: str) -> ReplyView:
        """Start the reply and show it on this page to its end (a stop of this page's task stops the reply)."""
        live = await self.live.start(self.key(), self.owner(), str(uuid.uuid4()), asked, chat, turn)
        view = ReplyView(live, lang, self.describe, own=True, chat=chat)
        cl.user_session.set("view", view)
        self._keep_tab(chat)
        showing = asyncio.create_task(view.run())
        try:
            await asyncio.shield(showing)
        except asyncio.CancelledError:  # Chainlit's stop cancels the message's task: the reply ends as stopped
            live.stop()
            await showing
        return view

    def stop(self) -> None:
        """The stop button of this page: stop the reply it shows (the engine drops the request)."""
        live = self.live.find(self.key(), self.owner())
        if live is not None and live.stop():
            log.info("Reply %s stopped from its page", live.reply_id)

    def went_away(self) -> None:
        """This page's websocket went away: its replies go on without it."""
        view: ReplyView | None = cl.user_session.get("view")
        if view is not None:
            view.went_away()
        tab = self.tabs.get(tab_id() or "") if not self.login else None
        if tab is not None:
            tab.seen = time.monotonic()

    async def came_back(self) -> None:
        """This page's websocket is there (after Chainlit's own start or resume): catch up or follow."""
        lang = getattr(cl.context.session, "language", None) or "en-US"
        view: ReplyView | None = cl.user_session.get("view")
        if getattr(cl.context.session, "restored", False) and view is not None:
            await view.catch_up()  # the same page after a cut: what was sent meanwhile was lost
            return
        for reply_id, metadata in cl.user_session.get("saved_under") or []:
            await send_under(reply_id, metadata, lang, self.describe)
        cl.user_session.set("saved_under", None)
        if cl.user_session.get("follow"):
            cl.user_session.set("follow", False)
            self._follow(self.live.find(self.key(), self.owner()), lang)

    def _follow(self, live: LiveReply | None, lang: str) -> None:
        chat: ChatSession | None = cl.user_session.get("chat")
        if live is None or chat is None:
            return
        view = ReplyView(live, lang, self.describe, own=False, chat=chat)
        cl.user_session.set("view", view)
        self.live.shown_by(asyncio.create_task(view.run()))  # kept from the GC; a drain waits for its end

    async def resumed(self, thread: Mapping[str, Any], lang: str) -> list[dict[str, Any]]:
        """A saved thread opened on this page: its reply still being written leaves the saved steps (the page
        follows it live); one whose app went away while it was written is marked cut off. The steps as shown."""
        steps: list[dict[str, Any]] = thread.get("steps") or []  # Chainlit shows these after on_chat_resume
        live = self.live.find(str(thread.get("id")), self.owner())
        for step in live_steps(steps):
            if live is not None and live.reply_id == step.get("id"):
                steps.remove(step)
            else:
                await _mark_cut_off(step, lang)
        if live is not None and all(step.get("id") != live.reply_id for step in steps):
            cl.user_session.set("follow", True)  # being written, or not saved yet: shown from the reply itself
        kept = [(step["id"], step_metadata(step)) for step in steps]  # each reply's sources and details
        cl.user_session.set("saved_under", [(i, m) for i, m in kept if DETAILS_KEY in m or SOURCES_KEY in m])
        return steps

    def tab_chat(self) -> ChatSession | None:
        """Without login: the chat this browser tab had (a reload), if it is still kept."""
        now = time.monotonic()
        self.tabs = {k: tab for k, tab in self.tabs.items() if now - tab.seen <= self.tab_memory_s}
        tab = self.tabs.get(tab_id() or "") if not self.login else None
        return tab.chat if tab is not None else None

    async def show_tab(self, lang: str) -> None:
        """Without login, after a reload: the tab's messages again, and its reply (live, or as it ended)."""
        tab = self.tabs[tab_id() or ""]
        live = self.live.find(tab.key, self.owner())
        # The page shows a conversation (and its stop button) only after a "first interaction"
        thread = {"interaction": "resume", "thread_id": cl.context.session.thread_id}
        await cl.context.emitter.emit("first_interaction", thread)
        for message in list(tab.messages):
            if live is not None and message.id == live.reply_id:
                continue  # followed live below
            copy = cl.Message.from_dict(message.to_dict())
            chat_context.add(copy)
            await cl.context.emitter.send_step(copy.to_dict())
            await send_under(copy.id, copy.metadata or {}, lang, self.describe)
        cl.user_session.set("reply_key", tab.key)
        tab.messages, tab.seen = _messages_of_this_page(), time.monotonic()
        self._follow(live, lang)

    def _keep_tab(self, chat: ChatSession) -> None:
        tab = tab_id()
        if not self.login and tab:
            self.tabs[tab] = Tab(chat, self.key(), _messages_of_this_page(), time.monotonic())

    async def shutdown(self) -> None:
        """The app stops: every reply being written is stopped and saved, marked cut off by the restart."""
        await self.live.shutdown()


def _messages_of_this_page() -> list[cl.Message]:
    """Chainlit's own list of this page's messages (it grows with the page)."""
    return chat_contexts.setdefault(cl.context.session.id, [])


async def _mark_cut_off(step: dict[str, Any], lang: str) -> None:
    """A reply saved while it was written, whose app went away meanwhile: what was written, marked cut off."""
    metadata = step_metadata(step)
    metadata.pop(LIVE_KEY, None)
    text = str(step.get("output") or "")
    step["output"] = f"{text}\n\n{t('restarted', lang)}" if text else t("restarted", lang)
    step["metadata"], step["streaming"] = metadata, False
    layer = get_data_layer()
    if layer is not None:
        await layer.update_step(step)
    log.info("Reply %s was cut off by a restart of the app: kept as it was", step.get("id"))


def on_every_connection(hook: Callable[[], Awaitable[None]]) -> None:
    """Run `hook` in the page's context each time a page's websocket connects or comes back, after Chainlit's own
    start or resume (which has sent the saved thread by then). Chainlit has no hook of its own for it."""
    from chainlit.server import sio

    handlers = sio.handlers["/"]
    chainlits = handlers["connection_successful"]

    async def connected(sid: str) -> None:
        await chainlits(sid)
        init_ws_context(sid)
        try:
            await hook()
        except Exception:  # the page works on without what the hook adds
            log.exception("After a page connected")

    handlers["connection_successful"] = connected
