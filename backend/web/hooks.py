"""What app.py's Chainlit hooks do: ChatApp holds the process's chat service (a message's turn, within its user's
quota), the API gateway, live replies and documents, and each hook forwards to one of its methods. They render what
backend.chat.ChatService does, and decide nothing; made at the import of app.py, it drops Chainlit's pauses, puts the
guard around its app and reads the ways in (Chainlit asks whether a login page is needed right after importing
app.py)."""

from __future__ import annotations

import logging
from typing import cast

import chainlit as cl
from chainlit.chat_context import chat_context
from chainlit.data.base import BaseDataLayer
from chainlit.types import CommandDict, Feedback, ThreadDict

from backend.accounts.login import login_metadata, setup_login
from backend.api.router import Gateway
from backend.chat.i18n import describe, t
from backend.chat.render import notice_text, settings_saved, starters, template_commands
from backend.chat.saved import CHAINLIT_STOP_NOTICE
from backend.chat.service import ChatService
from backend.chat.turn import ChatSession
from backend.config import load_config
from backend.documents.library import Library
from backend.errors import ConfigError, StorageError
from backend.logs import setup_logging
from backend.ops import drain, metrics
from backend.storage.persistence import Persistence
from backend.tuning.tuner import first_start_choice
from backend.web import guard, page, routes, sign_in
from backend.web.documents import (
    apply_upload_settings,
    delete_document,
    install_upload_guard,
    show_library,
    take_attachments,
)
from backend.web.login import login_user
from backend.web.pauses import without_chainlit_pauses
from backend.web.replies import Replies, on_every_connection
from backend.web.view import offer_actions, run_as_task, say, send_export, settings_widgets, take_back_last_reply

log = logging.getLogger("app")


def _lang() -> str:
    return getattr(cl.context.session, "language", None) or "en-US"  # a page's (websocket) session has one


class ChatApp:
    """The chat on Chainlit's pages: what each of app.py's hooks does."""

    def __init__(self) -> None:
        without_chainlit_pauses()  # Chainlit's 1 ms sleeps per message and step, and before on_message (pauses.py)
        self.guard = guard.install()  # every request passes it: origin, body size, ended sessions, headers (guard.py)
        self.service: ChatService | None = None
        self.gateway: Gateway | None = None  # the API for tools; it opens the database of keys and quotas
        self.startup_error: ConfigError | None = None
        self.replies: Replies | None = None  # the replies being written, which pages follow (backend.web.replies)
        self.library: Library | None = None  # the users' documents (backend.documents), when documents are on
        self.accounts = setup_login()
        self.persistence = Persistence()
        self.ways = sign_in.ways()  # password, the organisation's OpenID Connect provider, a sign-in proxy
        self.sign_in: sign_in.SignIn | None = None
        if self.ways.oidc:
            sign_in.show_button(self.ways.button)

    @property
    def password_login_on(self) -> bool:
        return self.accounts is not None and self.ways.password

    async def password_login(self, username: str, password: str) -> cl.User | None:
        assert self.accounts is not None
        name = await self.accounts.login(username, password)
        return cl.User(identifier=name, metadata=login_metadata()) if name else None

    def data_layer(self) -> BaseDataLayer | None:
        return self.persistence.layer()  # None (no history) until startup opened the database, or if it failed

    # ----- the process ------------------------------------------------------------------------------------------
    async def startup(self) -> None:
        setup_logging()
        try:
            service = ChatService.from_config(load_config(), recorder=metrics.METRICS, choose=first_start_choice)
        except ConfigError as exc:
            self.startup_error = exc
            log.error("%s", exc)
            return
        self.service = service
        page.own_files_folder(service.cfg.paths.data / "files")  # not <project>/.files, shared by every process there
        await self.persistence.open(service.cfg, login=self.accounts is not None)
        self.gateway = await Gateway.open(service, self.accounts, metrics.METRICS.request_finished, identify=login_user)
        service.quota.store = self.gateway.quotas  # the chat's turns count in the quotas of their users' API requests
        self.sign_in = await sign_in.open_sign_in(service.cfg, self.gateway)
        routes.install_routes(service, api=self.gateway, guard=self.guard, sign_in=self.sign_in)
        page.install_page(service)
        metrics.watch(service.supervisor)
        self.replies = Replies(service.cfg.chat, service.describe, login=self.accounts is not None)
        drain.Drain(service, self.replies.live).install()  # SIGTERM: finish the replies in flight and their pages first
        on_every_connection(self.replies.came_back)
        self.library = await self._open_library(service)
        service.start()

    async def _open_library(self, service: ChatService) -> Library | None:
        """The users' documents in the app's database, their uploads guarded (None: off, or the database failed)."""
        apply_upload_settings(service.cfg.documents)
        if not service.cfg.documents.enabled:
            return None
        try:
            library = await Library.open(service.cfg)
        except StorageError as exc:
            log.error("Documents are not available: %s", exc)
            return None
        install_upload_guard(library, login=self.accounts is not None)
        service.finder = library
        if self.gateway is not None:
            self.gateway.library = library  # the API's /v1/documents
        return library

    async def shutdown(self) -> None:
        if self.replies is not None:
            await self.replies.shutdown()  # each reply being written is saved, marked cut off by the restart
        if self.service is not None:
            await self.service.stop()
        if self.sign_in is not None:
            await self.sign_in.stop()
        if self.gateway is not None:
            await self.gateway.close()
        if self.library is not None:
            await self.library.close()

    # ----- a page's chat ----------------------------------------------------------------------------------------
    async def _open(self, session: ChatSession | None, greet: bool) -> None:
        """Keep the chat's session and show what it should know first (or why the service is down)."""
        cl.user_session.set("chat", session)
        cl.user_session.set("storage_mark", self.persistence.mark())
        if session is not None and self.library is not None and self.replies is not None:
            session.owner = self.replies.owner()  # whose documents its messages are answered from
            await self.library.came_back(session.owner)
        if self.service is None or session is None:
            await say(t("error", _lang(), error=describe(self.startup_error, _lang())))
            return
        # one line per user
        session.line_owner = self.replies.owner() if self.replies is not None else cl.context.session.id
        if (restarting := self.service.restarting()) is not None:
            await say(t("error", _lang(), error=describe(restarting, _lang())))
        await self._send_settings(session)
        if greet:  # the demo model's notice comes with the first reply: a message here would hide the starters
            if news := self.service.template_news(session):
                await say(notice_text(news, _lang()))
            await self._show_storage_problem()

    async def starters(self, language: str | None) -> list[cl.Starter]:
        return [cl.Starter(label=label, message=text) for label, text in starters(language or "en-US")]

    async def chat_start(self) -> None:
        metrics.chat_started(cl.context.session.id)
        kept = self.replies.tab_chat() if self.replies else None  # without login, a reloaded tab gets its chat back
        await self._open(kept or (self.service.new_session() if self.service else None), greet=kept is None)
        if kept is not None and self.replies is not None:
            await self.replies.show_tab(_lang())

    async def chat_resume(self, thread: ThreadDict) -> None:
        # a reply still being written: followed live
        steps = await self.replies.resumed(thread, _lang()) if self.replies else []
        saved = cl.context.session.chat_settings or {}
        resumed = self.service.thread_session(thread, saved, steps) if self.service else None
        await self._open(resumed, greet=False)

    async def stopped(self) -> None:
        """Stop the reply this page shows (wherever it was asked); Chainlit says "Task manually stopped." in English:
        the stopped reply says it in the user's language."""
        if self.replies is not None:
            self.replies.stop()
        for message in reversed(chat_context.get()):
            if message.content == CHAINLIT_STOP_NOTICE:
                await message.remove()
                return

    async def feedback(self, given: Feedback) -> None:
        metrics.feedback_given(given.value, given.comment)  # Chainlit's data layer keeps it with the thread

    async def chat_end(self) -> None:
        metrics.chat_ended(cl.context.session.id)
        if self.replies is not None:
            self.replies.went_away()  # its reply goes on
            if self.library is not None:
                await self.library.went_away(self.replies.owner())  # without login, the tab's documents go with it

    async def _send_settings(self, session: ChatSession) -> None:
        """The settings panel and the / menu (both list the templates, with their descriptions)."""
        assert self.service is not None
        described = self.service.templates.describe()
        widgets = settings_widgets(session.settings, described, self.service.serving_demo, _lang())
        await cl.ChatSettings(widgets).send()
        await cl.context.emitter.set_commands(cast("list[CommandDict]", template_commands(described, _lang())))

    async def settings_update(self, values: dict) -> None:
        session: ChatSession | None = cl.user_session.get("chat")
        if self.service is not None and session is not None:
            changed = self.service.update_settings(session, values)
            await self._send_settings(session)  # the template's help line follows the choice
            ws = cl.context.session
            if getattr(ws, "has_first_interaction", False):  # a saved thread exists: keep its settings with it now
                await self.persistence.keep_session(ws.thread_id, ws.to_persistable())
            await cl.context.emitter.send_toast(settings_saved(changed, _lang()), "success")

    async def _show_storage_problem(self) -> None:
        """Tell the user once when conversations cannot be saved (the chat goes on without history)."""
        problem = self.persistence.news(cl.user_session.get("storage_mark"))
        if problem is not None:
            await say(t("storage_failed", _lang(), error=describe(problem, _lang())))

    # ----- a message and its reply ------------------------------------------------------------------------------
    async def on_message(self, message: cl.Message) -> None:
        session: ChatSession | None = cl.user_session.get("chat")
        if self.service is None or session is None:
            await say(t("error", _lang(), error=describe(self.startup_error, _lang())))
            return
        if self.library is not None and session.owner is not None and message.elements:
            taken = await take_attachments(self.library, session.owner, message.elements, _lang())
            if taken and not (message.content or "").strip():
                return  # files without a question: kept, nothing to answer yet
        async with session.lock:  # one reply at a time per chat: rapid sends queue up
            await self._answer(session, message.content or "", message.command, message.id)

    async def _answer(self, session: ChatSession, text: str, command: str | None, message_id: str) -> None:
        """One turn, in a task of its own (backend.web.replies): this page shows it, as can any other of its owner."""
        assert self.service is not None and self.replies is not None
        ws = cl.context.session
        user = ws.user.identifier if self.accounts is not None and ws.user else None
        turn = self.service.answer(user, session, text, command, message_id)
        view = await self.replies.answer(session, turn, message_id, _lang())
        if view.finished:
            await offer_actions(view.reply, view.lang)
        await self._show_storage_problem()

    async def regenerate(self) -> None:
        """The last reply again: its message is asked anew (the service drops the turn it asked before)."""
        asked = await take_back_last_reply()
        await (run_as_task(self.on_message(asked)) if asked else say(t("nothing_to_regenerate", _lang())))

    async def export(self, action: cl.Action) -> None:
        session: ChatSession | None = cl.user_session.get("chat")
        await send_export(session.history if session else [], str(action.payload.get("format")), _lang())

    # ----- the user's documents ---------------------------------------------------------------------------------
    def _owner(self) -> str | None:
        session: ChatSession | None = cl.user_session.get("chat")
        return session.owner if self.library is not None and session is not None else None

    async def show_library(self) -> None:
        if self.library is not None and (owner := self._owner()) is not None:
            await show_library(self.library, owner, _lang())

    async def delete_document(self, action: cl.Action) -> None:
        if self.library is not None and (owner := self._owner()) is not None:
            await delete_document(self.library, owner, action.payload, _lang())
            await action.remove()
