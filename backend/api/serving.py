"""One API request, the chat's way: the same ChatService path as a chat message (the engine's readiness, the
template routing, the context fitting, the one streaming client), so a tool gets the same answers and errors.

Model names: the served model's name answers with the automatic template routing; "<model>:<template>" (or the
request's "template" field) with that template, as the chat's / menu does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from backend.api.documents import library_owner
from backend.api.protocol import CompletionRequest
from backend.chat.client import ChatStream, Message
from backend.chat.request import ChatRequest, UserSettings, clean_input
from backend.chat.service import ChatService
from backend.errors import ApiError, BackendUnavailableError
from backend.prompts.store import UnknownTemplate

AUTO = "auto"


@dataclass(frozen=True)
class Prepared:
    """A request ready to stream: what goes to the engine, and the model name the answer carries."""

    request: ChatRequest
    model: str


def split_messages(body: CompletionRequest) -> tuple[list[Message], str, str | None]:
    """(the earlier turns, the last user message, the caller's system text or None) of an OpenAI message list."""
    system = [m.text() for m in body.messages if m.role in ("system", "developer")]
    turns = [m for m in body.messages if m.role in ("user", "assistant")]
    if not turns or turns[-1].role != "user":
        raise ApiError.of("api.bad_request", detail="the last message must be a user message")
    history: list[Message] = [{"role": m.role, "content": m.text()} for m in turns[:-1]]
    return history, turns[-1].text(), ("\n\n".join(system) if system else None)


class ApiServing:
    """Builds and streams API requests through the chat service."""

    def __init__(self, service: ChatService) -> None:
        self.service = service

    def base_model(self) -> str:
        return self.service.serving().model

    def models(self) -> list[str]:
        """The model names /v1/models lists: the served model, then one per template."""
        base = self.base_model()
        return [base, *(f"{base}:{name}" for name in self.service.templates.names())]

    def template_of(self, body: CompletionRequest) -> str | None:
        """The template the request asks for (None: the automatic routing); ApiError for an unknown model name."""
        base, names = self.base_model(), self.service.templates.names()
        model, _, template = body.model.partition(":")
        if model not in (base, AUTO) and model not in names:
            raise ApiError.of("api.unknown_model", name=body.model, known=", ".join(self.models()))
        chosen = body.template or template or (model if model in names else None)
        return None if chosen in (None, "", AUTO) else chosen

    async def wait_ready(self) -> None:
        """Return once the engine is ready; raise its failure or BackendUnavailableError (the chat's wait)."""
        last = None
        async for waited in self.service.wait_for_engine():
            last = waited
        if last is None or last.state == "ready":
            return
        if last.state == "failed" and last.problem is not None:
            raise last.problem
        raise BackendUnavailableError.of("engine.not_ready", seconds=last.elapsed_s)

    def check(self, body: CompletionRequest) -> tuple[str | None, list[Message], str, str | None]:
        """What can be refused without the engine, before a quota place is taken (ServiceError): the model and template
        names, the messages' shape, the newest message (empty, or over chat.max_input_chars). Returns (the template or
        None, the earlier turns, the cleaned newest message, the caller's system text or None)."""
        command = self.template_of(body)
        names = self.service.templates.names()
        if command is not None and command not in names:
            raise UnknownTemplate(command, names)
        history, text, system = split_messages(body)
        return command, history, clean_input(text, self.service.cfg.chat.max_input_chars), system

    async def prepare(self, body: CompletionRequest, user: str | None = None) -> Prepared:
        """The engine request for `body` (ServiceError: the chat's refusal of the same message). A message is sent as
        it is: one that begins with "/" is no command here (the template comes from the model name or "template").
        With `documents`, the passages of the caller's library (`user`, a login user) are sent as the chat sends
        them."""
        command, history, text, system = self.check(body)
        cfg = self.service.cfg
        settings = UserSettings.defaults(cfg, self.service.serving_demo)
        settings.update(body.sampling(), cfg, self.service.serving_demo)
        owner = library_owner(user, self.service.finder is not None) if body.documents else None
        await self.wait_ready()
        request = await self.service.build_request(
            history, text, settings, command, system=system, commands=False, owner=owner
        )
        request.sampling.update(body.engine_options())
        return Prepared(request, body.model)

    def stream(self, prepared: Prepared) -> ChatStream:
        """The one streaming client's stream for the request (closing it aborts the engine's work)."""
        return self.service.client.stream(prepared.request.messages, **prepared.request.sampling)


async def detached(stream: ChatStream, heartbeat_s: float | None = None) -> AsyncIterator[str]:
    """The stream's pieces, read in a task of its own, which is cancelled when this generator ends early.

    Starlette stops a response whose client went away by cancelling an anyio scope, and in a cancelled scope
    every later await is cancelled again: the stream's own close (the engine's request) could be cut short and
    the engine write the whole reply for nobody. Cancelling a plain task happens once, so its close runs whole.

    `heartbeat_s`: an empty piece when nothing came for that long (a response that sends nothing until the end
    writes a byte with it: only a write finds out that the client went away)."""
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    async def pump() -> None:
        try:
            async with stream:
                async for piece in stream:
                    queue.put_nowait(("piece", piece))
            queue.put_nowait(("end", None))
        except Exception as exc:  # handed to the reader, which raises it
            queue.put_nowait(("error", exc))

    task = asyncio.ensure_future(pump())
    try:
        while True:
            try:
                kind, value = await asyncio.wait_for(queue.get(), heartbeat_s)
            except TimeoutError:
                yield ""
                continue
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        if not task.done():
            task.cancel()  # the stream closes inside the task: the engine aborts the request
