"""Chainlit hooks of the ERNIE chat service. The work is done in backend/; this file wires it to the UI."""

from __future__ import annotations

import asyncio
import logging
import time

import chainlit as cl
from chainlit.data.base import BaseDataLayer
from chainlit.input_widget import Select, Slider
from chainlit.types import ThreadDict
from chainlit.utils import utc_now

from backend.accounts.login import setup_login
from backend.chat.i18n import t
from backend.chat.pacing import paced
from backend.chat.service import ChatService, UserSettings, clean_input
from backend.config import load_config
from backend.errors import ConfigError, InvalidInputError, PromptTooLongError, ServiceError
from backend.logs import setup_logging
from backend.ops import metrics, web
from backend.serving.supervisor import State
from backend.storage.persistence import Persistence
from backend.storage.resume import TURN_KEY, history_from_thread, turn_metadata

log = logging.getLogger("app")
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
        SERVICE = ChatService.from_config(load_config())
    except ConfigError as exc:
        STARTUP_ERROR = exc
        log.error("%s", exc)
        return
    await PERSISTENCE.open(SERVICE.cfg, login=ACCOUNTS is not None)
    web.install_routes(SERVICE)
    metrics.watch(SERVICE.supervisor)
    SERVICE.start()


@cl.on_app_shutdown
async def shutdown() -> None:
    if SERVICE is not None:
        await SERVICE.stop()


@cl.on_chat_start
async def chat_start() -> None:
    metrics.chat_started(cl.context.session.id)
    cl.user_session.set("history", [])
    cl.user_session.set("turn_lock", asyncio.Lock())
    if SERVICE is None:
        await _say(t("error", _lang(), error=STARTUP_ERROR))
        return
    cl.user_session.set("settings", UserSettings.defaults(SERVICE.cfg, SERVICE.serving_demo))
    cl.user_session.set("storage_mark", PERSISTENCE.mark())
    await _send_settings()
    if SERVICE.supervisor.status.note:
        await _say(t("demo", _lang(), note=SERVICE.supervisor.status.note))
    await _show_template_problems()
    await _show_storage_problem()


@cl.on_chat_resume
async def chat_resume(thread: ThreadDict) -> None:
    cl.user_session.set("history", history_from_thread(thread))
    if SERVICE is None:
        await _say(t("error", _lang(), error=STARTUP_ERROR))
        return
    settings = UserSettings.defaults(SERVICE.cfg, SERVICE.serving_demo)
    settings.update(cl.context.session.chat_settings or {}, SERVICE.cfg, SERVICE.serving_demo)
    cl.user_session.set("settings", settings)
    cl.user_session.set("storage_mark", PERSISTENCE.mark())
    await _send_settings()


async def _send_settings() -> None:
    assert SERVICE is not None
    lang, settings = _lang(), cl.user_session.get("settings")
    names = ["auto", *SERVICE.templates.names()]
    await cl.ChatSettings(
        [
            Slider(
                id="temperature",
                label=t("setting_temperature", lang),
                initial=settings.temperature,
                min=0,
                max=2,
                step=0.05,
            ),
            Slider(id="top_p", label=t("setting_top_p", lang), initial=settings.top_p, min=0.05, max=1, step=0.05),
            Slider(
                id="max_tokens",
                label=t("setting_max_tokens", lang),
                initial=settings.max_tokens,
                min=16,
                max=4096,
                step=16,
            ),
            Select(
                id="template",
                label=t("setting_template", lang),
                values=names,
                initial_value=settings.template if settings.template in names else "auto",
                description=t("template_auto", lang),
            ),
        ]
    ).send()


@cl.on_chat_end
async def chat_end() -> None:
    metrics.chat_ended(cl.context.session.id)


@cl.on_settings_update
async def settings_update(values: dict) -> None:
    if SERVICE is not None:
        cl.user_session.get("settings").update(values, SERVICE.cfg, SERVICE.serving_demo)


async def _show_template_problems() -> None:
    assert SERVICE is not None
    problems = [str(p) for p in SERVICE.templates.problems()]
    seen = cl.user_session.get("template_problems") or []
    if problems and problems != seen:
        await _say(t("template_problems", _lang()) + "\n" + "\n".join(f"- {p}" for p in problems))
    cl.user_session.set("template_problems", problems)


async def _show_storage_problem() -> None:
    """Tell the user once when conversations cannot be saved (the chat goes on without history)."""
    problem = PERSISTENCE.news(cl.user_session.get("storage_mark"))
    if problem is not None:
        await _say(t("storage_failed", _lang(), error=problem))


async def _wait_for_engine() -> bool:
    """Tell the user while the engine starts; True once it is ready."""
    assert SERVICE is not None
    sup, lang = SERVICE.supervisor, _lang()
    if sup.ready:
        return True
    sup.request_retry()
    started = time.monotonic()
    note = cl.Message(content="", author="system")
    sent = False
    while not await sup.wait_ready(1.0):
        st = sup.status
        if st.state in (State.FAILED, State.STOPPED):
            note.content = t("failed", lang, error=st.error or "", hint=st.hint or "")
            if st.log_tail:
                note.content += "\n\n" + t("log_tail", lang, path=sup.log_path) + f"\n```text\n{st.log_tail}\n```"
        elif time.monotonic() - started > SERVICE.cfg.timeouts.wait_for_ready_s:
            note.content = t("not_ready", lang, elapsed=time.monotonic() - started)
        else:
            key = "restarting" if st.state == State.RESTARTING else "starting"
            note.content = t(key, lang, elapsed=st.elapsed_s, error=st.error or "")
            await (note.update() if sent else note.send())
            sent = True
            continue
        await (note.update() if sent else note.send())
        return False
    if sent:
        note.content = t("ready", lang, elapsed=time.monotonic() - started)
        await note.update()
    return True


@cl.on_message
async def on_message(message: cl.Message) -> None:
    # One reply at a time per chat: rapid repeated sends queue up instead of interleaving the history.
    lock = cl.user_session.get("turn_lock")
    if lock is None:  # a resumed chat starts without on_chat_start
        lock = asyncio.Lock()
        cl.user_session.set("turn_lock", lock)
    async with lock:
        await _answer(message)


async def _answer(message: cl.Message) -> None:
    if SERVICE is None:
        await _say(t("error", _lang(), error=STARTUP_ERROR))
        return
    lang, cfg = _lang(), SERVICE.cfg
    history: list[dict[str, str]] = cl.user_session.get("history")
    settings: UserSettings = cl.user_session.get("settings")
    try:
        text = clean_input(message.content or "", cfg.chat.max_input_chars)
    except InvalidInputError as exc:
        key = "too_large" if "chars" in exc.params else "empty"
        await _say(t(key, lang, **exc.params))
        return
    await _show_template_problems()
    if not await _wait_for_engine():
        metrics.record_error("unavailable")
        return
    try:
        request = await SERVICE.build_request(history, text, settings)
    except (PromptTooLongError, ServiceError) as exc:
        metrics.record_error(exc)
        await _say(t("error", lang, error=exc))
        return
    if request.dropped:
        await _say(t("trimmed", lang, dropped=request.dropped))

    # A streamed message gets no time of its own (it is never send()): saved without one, it would sort first.
    reply = cl.Message(content="", created_at=utc_now())
    parts: list[str] = []
    ending = ""
    failure: BaseException | None = None
    stream = SERVICE.client.stream(request.messages, **request.sampling)
    try:
        async with stream:
            async for piece in paced(stream, cfg.chat.stream_flush_ms / 1000):
                parts.append(piece)
                await reply.stream_token(piece)
    except asyncio.CancelledError as exc:
        # The stop button: the stream is closed above (vLLM aborts the request); keep what arrived.
        failure, ending = exc, t("stopped", lang)
    except ServiceError as exc:
        log.warning("Reply failed: %s", exc)
        failure, ending = exc, t("interrupted" if parts else "error", lang, error=exc)
    metrics.reply_finished(stream.stats, failure)
    text_out = "".join(parts)
    footer = f"\n\n*{t('template_used', lang, name=request.template)} · {request.reason}*"
    reply.content = text_out + (f"\n\n{ending}" if ending else "") + footer
    if text_out:
        # The turn as the model saw it: a resumed thread rebuilds the history from these.
        reply.metadata = turn_metadata(request.user_text, text_out)
    await (reply.update() if parts else reply.send())
    if text_out:
        history += reply.metadata[TURN_KEY]
    await _show_storage_problem()
