"""Chainlit hooks of the ERNIE chat service: they render what backend.chat.ChatService does, and decide nothing."""

from __future__ import annotations

import logging

import chainlit as cl
from chainlit.chat_context import chat_context
from chainlit.data.base import BaseDataLayer
from chainlit.types import Feedback, ThreadDict

from backend.accounts.login import login_metadata, setup_login
from backend.api.router import Gateway
from backend.chat.i18n import describe, t
from backend.chat.render import notice_text, settings_saved, starters, template_commands
from backend.chat.saved import CHAINLIT_STOP_NOTICE, asked_ids, counts_from_thread, history_from_thread, notices
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
    DELETE_DOCUMENT,
    SHOW_LIBRARY,
    apply_upload_settings,
    delete_document,
    install_upload_guard,
    show_library,
    take_attachments,
)
from backend.web.login import login_user
from backend.web.pauses import without_chainlit_pauses
from backend.web.replies import Replies, on_every_connection
from backend.web.view import (
    EXPORT,
    REGENERATE,
    offer_actions,
    run_as_task,
    say,
    send_export,
    settings_widgets,
    take_back_last_reply,
)

log = logging.getLogger("app")
without_chainlit_pauses()  # Chainlit's 1 ms sleeps per message and step, and before on_message (web/pauses.py)
GUARD = guard.install()  # every request passes it: origin, body size, ended sessions, security headers (ops/guard.py)
SERVICE: ChatService | None = None
GATEWAY: Gateway | None = None  # the API for tools, and the quotas the chat shares with it
STARTUP_ERROR: ConfigError | None = None
REPLIES: Replies | None = None  # the replies being written, which pages follow (backend.web.replies)
LIBRARY: Library | None = None  # the users' documents (backend.documents), when documents are on
# Decided at import: Chainlit asks whether a login page is needed right after importing this file.
ACCOUNTS = setup_login()
PERSISTENCE = Persistence()

WAYS = sign_in.ways()  # password, the organisation's OpenID Connect provider, a sign-in proxy (backend.web.sign_in)
SIGN_IN: sign_in.SignIn | None = None

if ACCOUNTS is not None and WAYS.password:

    @cl.password_auth_callback
    async def password_login(username: str, password: str) -> cl.User | None:
        assert ACCOUNTS is not None
        name = await ACCOUNTS.login(username, password)
        return cl.User(identifier=name, metadata=login_metadata()) if name else None


if WAYS.oidc:
    sign_in.show_button(WAYS.button)

    @cl.oauth_callback
    async def oauth_login(*_: object) -> cl.User | None:
        return None  # never called: the app's own routes take over Chainlit's OAuth routes (backend.web.sign_in)


if WAYS.proxy:

    @cl.header_auth_callback
    async def header_login(*_: object) -> cl.User | None:
        return None  # never called: the app's own /auth/header believes trusted proxies only (backend.web.sign_in)


@cl.data_layer
def data_layer() -> BaseDataLayer | None:
    return PERSISTENCE.layer()  # None (no history) until startup opened the database, or if it failed


def _lang() -> str:
    return cl.context.session.language or "en-US"


@cl.on_app_startup
async def startup() -> None:
    global SERVICE, STARTUP_ERROR, GATEWAY, REPLIES, LIBRARY, SIGN_IN
    setup_logging()
    try:
        SERVICE = ChatService.from_config(load_config(), recorder=metrics.METRICS, choose=first_start_choice)
    except ConfigError as exc:
        STARTUP_ERROR = exc
        log.error("%s", exc)
        return
    page.own_files_folder(SERVICE.cfg.paths.data / "files")  # not <project>/.files, shared by every process there
    await PERSISTENCE.open(SERVICE.cfg, login=ACCOUNTS is not None)
    GATEWAY = await Gateway.open(SERVICE, ACCOUNTS, metrics.METRICS.request_finished, identify=login_user)
    SIGN_IN = await sign_in.open_sign_in(SERVICE.cfg, GATEWAY)
    routes.install_routes(SERVICE, api=GATEWAY, guard=GUARD, sign_in=SIGN_IN)
    page.install_page(SERVICE)
    metrics.watch(SERVICE.supervisor)
    REPLIES = Replies(SERVICE.cfg.chat, SERVICE.describe, login=ACCOUNTS is not None)
    drain.Drain(SERVICE, REPLIES.live).install()  # SIGTERM: finish the replies in flight and their pages' ends first
    on_every_connection(REPLIES.came_back)
    LIBRARY = await _open_library()
    SERVICE.start()


async def _open_library() -> Library | None:
    """The users' documents in the app's database, their uploads guarded (None: off, or the database failed)."""
    assert SERVICE is not None
    apply_upload_settings(SERVICE.cfg.documents)
    if not SERVICE.cfg.documents.enabled:
        return None
    try:
        library = await Library.open(SERVICE.cfg)
    except StorageError as exc:
        log.error("Documents are not available: %s", exc)
        return None
    install_upload_guard(library, login=ACCOUNTS is not None)
    SERVICE.finder = library
    if GATEWAY is not None:
        GATEWAY.library = library  # the API's /v1/documents
    return library


@cl.on_app_shutdown
async def shutdown() -> None:
    if REPLIES is not None:
        await REPLIES.shutdown()  # each reply being written is saved, marked cut off by the restart
    if SERVICE is not None:
        await SERVICE.stop()
    if SIGN_IN is not None:
        await SIGN_IN.stop()
    if GATEWAY is not None:
        await GATEWAY.close()
    if LIBRARY is not None:
        await LIBRARY.close()


async def _open(session: ChatSession | None, greet: bool) -> None:
    """Keep the chat's session and show what it should know first (or why the service is down)."""
    cl.user_session.set("chat", session)
    cl.user_session.set("storage_mark", PERSISTENCE.mark())
    if session is not None and LIBRARY is not None and REPLIES is not None:
        session.owner = REPLIES.owner()  # whose documents its messages are answered from
        await LIBRARY.came_back(session.owner)
    if SERVICE is None or session is None:
        await say(t("error", _lang(), error=describe(STARTUP_ERROR, _lang())))
        return
    session.line_owner = REPLIES.owner() if REPLIES is not None else cl.context.session.id  # one line per user
    if (restarting := SERVICE.restarting()) is not None:
        await say(t("error", _lang(), error=describe(restarting, _lang())))
    await _send_settings(session)
    if greet:  # the demo model's notice comes with the first reply: a message here would hide the starters
        if news := SERVICE.template_news(session):
            await say(notice_text(news, _lang()))
        await _show_storage_problem()


@cl.set_starters
async def first_page_starters(user: cl.User | None, language: str | None = None) -> list[cl.Starter]:
    return [cl.Starter(label=label, message=text) for label, text in starters(language or "en-US")]


@cl.on_chat_start
async def chat_start() -> None:
    metrics.chat_started(cl.context.session.id)
    kept = REPLIES.tab_chat() if REPLIES else None  # without login, a reloaded tab gets its chat back
    await _open(kept or (SERVICE.new_session() if SERVICE else None), greet=kept is None)
    if kept is not None and REPLIES is not None:
        await REPLIES.show_tab(_lang())


@cl.on_chat_resume
async def chat_resume(thread: ThreadDict) -> None:
    steps = await REPLIES.resumed(thread, _lang()) if REPLIES else []  # a reply still being written: followed live
    saved, asked = cl.context.session.chat_settings or {}, asked_ids(steps)
    history, counts = history_from_thread(thread), counts_from_thread(thread)
    resumed = SERVICE.resumed_session(history, saved, asked, counts, notices(steps)) if SERVICE else None
    await _open(resumed, greet=False)


@cl.on_stop
async def stopped() -> None:
    """Stop the reply this page shows (wherever it was asked); Chainlit says "Task manually stopped." in English:
    the stopped reply says it in the user's language."""
    if REPLIES is not None:
        REPLIES.stop()
    for message in reversed(chat_context.get()):
        if message.content == CHAINLIT_STOP_NOTICE:
            await message.remove()
            return


@cl.on_feedback
async def feedback(given: Feedback) -> None:
    metrics.feedback_given(given.value, given.comment)  # Chainlit's data layer keeps it with the thread


@cl.on_chat_end
async def chat_end() -> None:
    metrics.chat_ended(cl.context.session.id)
    if REPLIES is not None:
        REPLIES.went_away()  # its reply goes on
        if LIBRARY is not None:
            await LIBRARY.went_away(REPLIES.owner())  # without login, the tab's documents go with it


async def _send_settings(session: ChatSession) -> None:
    """The settings panel and the / menu (both list the templates, with their descriptions)."""
    assert SERVICE is not None
    described = SERVICE.templates.describe()
    await cl.ChatSettings(settings_widgets(session.settings, described, SERVICE.serving_demo, _lang())).send()
    await cl.context.emitter.set_commands(template_commands(described, _lang()))


@cl.on_settings_update
async def settings_update(values: dict) -> None:
    session: ChatSession | None = cl.user_session.get("chat")
    if SERVICE is not None and session is not None:
        changed = SERVICE.update_settings(session, values)
        await _send_settings(session)  # the template's help line follows the choice
        ws = cl.context.session
        if getattr(ws, "has_first_interaction", False):  # a saved thread exists: keep its settings with it now
            await PERSISTENCE.keep_session(ws.thread_id, ws.to_persistable())
        await cl.context.emitter.send_toast(settings_saved(changed, _lang()), "success")


async def _show_storage_problem() -> None:
    """Tell the user once when conversations cannot be saved (the chat goes on without history)."""
    problem = PERSISTENCE.news(cl.user_session.get("storage_mark"))
    if problem is not None:
        await say(t("storage_failed", _lang(), error=describe(problem, _lang())))


@cl.on_message
async def on_message(message: cl.Message) -> None:
    session: ChatSession | None = cl.user_session.get("chat")
    if SERVICE is None or session is None:
        await say(t("error", _lang(), error=describe(STARTUP_ERROR, _lang())))
        return
    if LIBRARY is not None and session.owner is not None and message.elements:
        taken = await take_attachments(LIBRARY, session.owner, message.elements, _lang())
        if taken and not (message.content or "").strip():
            return  # files without a question: kept, nothing to answer yet
    async with session.lock:  # one reply at a time per chat: rapid sends queue up
        await _answer(session, message.content or "", message.command, message.id)


async def _answer(session: ChatSession, text: str, command: str | None, message_id: str) -> None:
    """One turn, in a task of its own (backend.web.replies): this page shows it, as can any other of its owner."""
    assert SERVICE is not None and REPLIES is not None and GATEWAY is not None
    user = cl.context.session.user.identifier if ACCOUNTS is not None and cl.context.session.user else None
    turn = GATEWAY.chat_turn(user, SERVICE.reply(session, text, command, message_id))
    view = await REPLIES.answer(session, turn, message_id, _lang())
    if view.finished:
        await offer_actions(view.reply, view.lang)
    await _show_storage_problem()


@cl.action_callback(REGENERATE)
async def regenerate(action: cl.Action) -> None:
    """The last reply again: its message is asked anew (the service drops the turn it asked before)."""
    asked = await take_back_last_reply()
    await (run_as_task(on_message(asked)) if asked else say(t("nothing_to_regenerate", _lang())))


@cl.action_callback(EXPORT)
async def export(action: cl.Action) -> None:
    session: ChatSession | None = cl.user_session.get("chat")
    await send_export(session.history if session else [], str(action.payload.get("format")), _lang())


@cl.action_callback(SHOW_LIBRARY)
async def library(action: cl.Action) -> None:
    session: ChatSession | None = cl.user_session.get("chat")
    if LIBRARY is not None and session is not None and session.owner is not None:
        await show_library(LIBRARY, session.owner, _lang())


@cl.action_callback(DELETE_DOCUMENT)
async def delete(action: cl.Action) -> None:
    session: ChatSession | None = cl.user_session.get("chat")
    if LIBRARY is not None and session is not None and session.owner is not None:
        await delete_document(LIBRARY, session.owner, action.payload, _lang())
        await action.remove()
