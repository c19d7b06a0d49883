"""Try a template against the running engine: one reply to a sample message, streamed, as the chat would ask for it
with that template chosen (ChatService.build_request on the model serving now, the chat's one client). Nothing is kept
or counted as a chat.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from backend.chat.client import Message
from backend.chat.request import UserSettings, clean_input
from backend.chat.service import ChatService
from backend.errors import ServiceError, WorkshopError
from backend.prompts.store import TemplateStore
from backend.workshop.drafts import chat_settings, chat_view, request_json


def _error(exc: ServiceError, locale: str | None) -> dict[str, Any]:
    message, hint = exc.localized(locale)
    return {"error": {"code": exc.code, "message": message, "hint": hint}}


async def try_reply(
    service: ChatService, store: TemplateStore, template: str, message: str, locale: str | None
) -> AsyncIterator[dict[str, Any]]:
    """Events of one reply with `template` (of `store`) chosen: {"request"}, then {"text"}s, then {"done"};
    {"error"} instead when the engine is not ready or the reply fails. Closing the iterator closes the stream
    (the engine then stops generating)."""
    if not service.supervisor.ready:
        state = service.supervisor.status.state.value
        yield _error(WorkshopError.of("workshop.engine_not_ready", state=state), locale)
        return
    settings: UserSettings = chat_settings(service)
    settings.template = template
    try:
        text = clean_input(message, service.cfg.chat.max_input_chars)  # the chat's own limit on a message
        request = await chat_view(service, store).build_request([], text, settings)
    except ServiceError as exc:
        yield _error(exc, locale)
        return
    yield {"request": request_json(request)}
    # The reply streams in a task of its own, as a chat turn does in Chainlit's task: the HTTP stream's cancel
    # scopes then never mix with those of the task the web server streams our answer from.
    events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    pump = asyncio.create_task(_stream(service, request.messages, request.sampling, events, locale))
    try:
        while (event := await events.get()) is not None:
            yield event
    finally:
        pump.cancel()  # the page went away: the stream is closed and the engine stops generating


async def _stream(
    service: ChatService,
    messages: list[Message],
    sampling: dict[str, Any],
    events: asyncio.Queue[dict[str, Any] | None],
    locale: str | None,
) -> None:
    stream = service.client.stream(messages, **sampling)
    try:
        async with stream:
            async for piece in stream:
                events.put_nowait({"text": piece})
        stats = stream.stats
        events.put_nowait(
            {"done": {"finish_reason": stats.finish_reason, "completion_tokens": stats.completion_tokens}}
        )
    except ServiceError as exc:
        events.put_nowait(_error(exc, locale))
    finally:
        events.put_nowait(None)
