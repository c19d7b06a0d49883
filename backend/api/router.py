"""The API's HTTP surface on Chainlit's FastAPI app: /v1/models, /v1/chat/completions, and the key page
(/api-keys, its calls under /api-keys/api). Errors are OpenAI error objects whose `code` is the app's error code,
in the language of the request's Accept-Language; over a quota, 429 with Retry-After."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ValidationError
from starlette.routing import BaseRoute, Mount
from starlette.types import Receive, Scope, Send

from backend.accounts.login import Accounts
from backend.api.access import ApiAccess, Caller, Identify, api_enabled
from backend.api.documents import document_routes
from backend.api.keys import KeyStore
from backend.api.protocol import (
    CompletionRequest,
    chunk_json,
    completion_id,
    completion_json,
    error_json,
    models_json,
    usage_chunk_json,
)
from backend.api.serving import ApiServing, Prepared, detached
from backend.chat.admission import Ticket
from backend.chat.client import ChatStream
from backend.chat.quota import Lease, Observer
from backend.chat.service import ChatService
from backend.chat.sources import user_owner
from backend.documents.library import Library
from backend.errors import (
    ApiError,
    BackendError,
    BackendUnavailableError,
    EngineStartError,
    InvalidInputError,
    PromptTooLongError,
    QuotaError,
    ServerFullError,
    ServiceError,
    StorageError,
)
from backend.storage.quotas import Quotas
from backend.storage.shared import SharedDatabase

log = logging.getLogger(__name__)

PAGE = "/api-keys"
PAGE_API = PAGE + "/api"
STATIC = Path(__file__).resolve().parent / "static"
HEARTBEAT_S = 1.0  # a whole reply writes a blank this often while it waits: a gone client is found out then

STATUS = {
    "api.off": 403, "api.remote": 403, "api.no_key": 401, "api.bad_key": 401, "api.login_needed": 401,
    "api.unknown_model": 404, "api.no_such_key": 404, "api.not_admin": 403, "api.foreign_origin": 403,
    "quota.unavailable": 503, "documents.not_found": 404, "documents.off": 404, "documents.no_library": 403,
}  # fmt: skip
STATUS_BY_KIND: list[tuple[type[ServiceError], int]] = [
    (QuotaError, 429),
    (ServerFullError, 503),
    (ApiError, 400),
    (InvalidInputError, 400),
    (PromptTooLongError, 400),
    (BackendUnavailableError, 503),
    (EngineStartError, 503),
    (StorageError, 503),
    (BackendError, 502),
]


def status_of(exc: ServiceError) -> int:
    """The HTTP status an error is answered with."""
    if exc.code in STATUS:
        return STATUS[exc.code]
    return next((status for kind, status in STATUS_BY_KIND if isinstance(exc, kind)), 500)


def _locale(request: Request) -> str:
    return request.headers.get("accept-language", "en")


# A quota used up for the day is not worth retrying soon (OpenAI's "insufficient_quota"; its clients do not retry it).
EXHAUSTED = {"quota.tokens"}


def error_body(exc: ServiceError, locale: str) -> tuple[int, dict[str, Any]]:
    message, hint = exc.localized(locale)
    text = f"{message}{'' if exc.translated(locale) else ' '}{hint}".strip()
    status = status_of(exc)
    body = error_json(status, exc.code or exc.key, text)
    if exc.code in EXHAUSTED:
        body["error"]["type"] = "insufficient_quota"
    return status, body


def retry_headers(exc: ServiceError) -> dict[str, str] | None:
    """Retry-After for a refusal that passes (a quota, a full line, a restart); x-should-retry: false for a quota
    used up until its reset (the official OpenAI clients obey it, and honour Retry-After up to 60 s)."""
    if not isinstance(exc, QuotaError | ServerFullError):
        return None
    headers = {"Retry-After": str(exc.retry_after_s)}
    if exc.code in EXHAUSTED:
        headers["x-should-retry"] = "false"
    return headers


def refusal(exc: ServiceError, request: Request) -> JSONResponse:
    """The OpenAI-style error response for `exc` (429 and 503 ones with Retry-After)."""
    status, body = error_body(exc, _locale(request))
    return JSONResponse(body, status_code=status, headers=retry_headers(exc))


def sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class ClosingStream(StreamingResponse):
    """A streaming response that closes its generator when the response ends, a gone client included, so the
    engine's request is aborted at once (not when the generator is garbage-collected)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


def tokens_used(stream: ChatStream, prepared: Prepared) -> tuple[int, int]:
    """(prompt, reply) tokens: the engine's usage, else the app's own count of the prompt and the streamed chunks."""
    return stream.stats.counted(prepared.request.prompt_tokens)


class KeyName(BaseModel):
    name: str


def _no_observer(route: str, outcome: str, prompt: int, reply: int) -> None:
    return None


@dataclass(frozen=True)
class Held:
    """What one API request holds while it runs: its quota place and its place in the line to the engine."""

    lease: Lease | None
    ticket: Ticket | None


class Gateway:
    """The API, with what it works on: the chat service, the database's keys, and the quotas and usage it shares with
    the chat (backend.storage.quotas; the chat's own turns take their places in backend.chat.quota)."""

    def __init__(
        self,
        service: ChatService,
        access: ApiAccess,
        keys: KeyStore | None,
        quotas: Quotas | None,
        problem: ServiceError | None = None,
        observe: Observer = _no_observer,
    ) -> None:
        self.service = service
        self.access = access
        self.keys = keys
        self.quotas = quotas
        self.problem = problem  # why there are no keys and quotas (the database could not be opened)
        self.serving = ApiServing(service)
        self.observe = observe
        self.db: SharedDatabase | None = None
        self.library: Library | None = None  # the users' documents, when the app has them (backend.api.documents)

    @classmethod
    async def open(
        cls, service: ChatService, accounts: Accounts | None, observe: Observer = _no_observer, *, identify: Identify
    ) -> Gateway:
        """The gateway on the app's database (opened and migrated when login or the API is on); `identify`: whose
        login a request of the key page carries."""
        cfg = service.cfg
        keys, quotas, problem, db = None, None, None, None
        if cfg.auth.enabled or api_enabled(cfg):
            try:
                db = SharedDatabase.from_config(cfg)
                await db.prepare()
            except StorageError as exc:
                problem = exc
            except (OSError, ImportError, ValueError) as exc:  # a driver missing, an unreadable URL
                problem = StorageError.of("storage.bad_url", url=db.where if db else "?", detail=str(exc))
            if problem is None and db is not None:
                keys, quotas = KeyStore(db), Quotas(db, cfg.api)
            else:
                log.error("API keys and quotas are not available: %s", problem)
        gateway = cls(service, ApiAccess(cfg, keys, accounts, identify), keys, quotas, problem, observe)
        gateway.db = db
        if gateway.access.enabled:
            log.info("The API answers at /v1 (%s).", "keys of logged-in users" if cfg.auth.enabled else "this machine")
        return gateway

    async def close(self) -> None:
        if self.quotas is not None:
            await self.quotas.close()
        if self.db is not None:
            await self.db.close()

    # ----- completions ----------------------------------------------------------------------------------------
    async def complete(self, request: Request) -> Response:
        try:
            if self.problem is not None and self.access.enabled:
                raise self.problem
            caller = await self.access.caller(request)
            body = self._body(await request.body())
            self.serving.check(body)  # what needs no engine is refused before a quota place is taken
        except ServiceError as exc:
            self.observe("api", "refused", 0, 0)
            return refusal(exc, request)
        lease: Lease | None = None
        ticket: Ticket | None = None
        try:
            if self.quotas is not None:
                lease = await self.quotas.admit(caller.user, "api")
            prepared = await self.serving.prepare(body, caller.user if self.access.login else None)
            # the line in front of the engine, shared with the chat: a login user's chats and tools wait as one
            ticket = await self.service.admit(user_owner(caller.user) if self.access.login else f"api:{caller.user}")
        except ServiceError as exc:
            if lease is not None:  # refused before the engine was asked for a reply: not counted
                await self.quotas.release_soon(lease, counted=False)  # type: ignore[union-attr]
            self.observe("api", "over_quota" if isinstance(exc, QuotaError) else "refused", 0, 0)
            return refusal(exc, request)
        except BaseException:
            if lease is not None:
                await self.quotas.release_soon(lease)  # type: ignore[union-attr]
            raise
        held = Held(lease, ticket)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            events = self._events(prepared, held, include_usage, _locale(request))
            return ClosingStream(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return await self._whole(prepared, held, request)

    @staticmethod
    def _body(raw: bytes) -> CompletionRequest:
        try:
            return CompletionRequest.model_validate_json(raw or b"{}")
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise ApiError.of(
                "api.bad_request", detail=f"{where}: {first.get('msg')}" if where else first["msg"]
            ) from exc

    async def _finish(self, held: Held, outcome: str, prompt: int, reply: int) -> None:
        if held.ticket is not None:
            held.ticket.leave()
        if held.lease is not None:
            held.lease.record(prompt, reply)
            await self.quotas.release_soon(held.lease)  # type: ignore[union-attr]
        self.observe("api", outcome, prompt, reply)

    async def _whole(self, prepared: Prepared, held: Held, request: Request) -> Response:
        """The whole reply as one object. It is sent as a stream of one part, so that a client that goes away
        meanwhile stops the engine's work as a streamed reply's does; an error before the first text gets its
        own status, a later one (the engine broke mid-reply) comes as the error object with status 200."""
        stream = self.serving.stream(prepared)
        pieces = detached(stream, HEARTBEAT_S)
        try:
            first = await anext(pieces, None)
        except ServiceError as exc:
            await self._finish(held, "error", *tokens_used(stream, prepared))
            return refusal(exc, request)
        except BaseException:
            await self._finish(held, "stopped", *tokens_used(stream, prepared))
            raise
        body = self._whole_body(prepared, held, stream, pieces, first, _locale(request))
        return ClosingStream(body, media_type="application/json")

    async def _whole_body(
        self,
        prepared: Prepared,
        held: Held,
        stream: ChatStream,
        pieces: AsyncIterator[str],
        first: str | None,
        locale: str,
    ) -> AsyncIterator[bytes]:
        parts = [first] if first else []  # a heartbeat before the first text is "": nothing
        outcome = "stopped"
        try:
            if first is not None:
                written = time.monotonic()
                async for piece in pieces:
                    if piece:
                        parts.append(piece)
                    if time.monotonic() - written >= HEARTBEAT_S:
                        written = time.monotonic()
                        yield b" "  # JSON may start with blanks: a write, to find out whether the client is there
            outcome = "ok"
        except ServiceError as exc:
            outcome = "error"
            yield json.dumps(error_body(exc, locale)[1], ensure_ascii=False).encode()
            return
        finally:
            await self._finish(held, outcome, *tokens_used(stream, prepared))
        prompt, reply = tokens_used(stream, prepared)
        finish = stream.stats.finish_reason or "stop"
        whole = completion_json(completion_id(), prepared.model, "".join(parts), finish, prompt, reply)
        if prepared.request.sources:  # our own field (docs/documents.md): the passages the model was given
            whole["sources"] = [source.saved() for source in prepared.request.sources]
        yield json.dumps(whole, ensure_ascii=False).encode()

    async def _events(self, prepared: Prepared, held: Held, include_usage: bool, locale: str) -> AsyncIterator[bytes]:
        """The reply as server-sent events; a client that goes away closes the stream (the engine stops)."""
        stream, cid, model = self.serving.stream(prepared), completion_id(), prepared.model
        outcome = "stopped"
        try:
            yield sse(chunk_json(cid, model, {"role": "assistant", "content": ""}))
            async for piece in detached(stream):
                yield sse(chunk_json(cid, model, {"content": piece}))
            last = chunk_json(cid, model, {}, stream.stats.finish_reason or "stop")
            if prepared.request.sources:  # our own field (docs/documents.md), on the last chunk
                last["sources"] = [source.saved() for source in prepared.request.sources]
            yield sse(last)
            if include_usage:
                yield sse(usage_chunk_json(cid, model, *tokens_used(stream, prepared)))
            outcome = "ok"
        except ServiceError as exc:
            outcome = "error"
            yield sse(error_body(exc, locale)[1])
        finally:
            await self._finish(held, outcome, *tokens_used(stream, prepared))
        yield b"data: [DONE]\n\n"

    # ----- the key page ---------------------------------------------------------------------------------------
    def _ready(self) -> KeyStore:
        if self.keys is None:
            raise self.problem or ApiError.of("api.off")
        return self.keys

    async def me(self, request: Request) -> dict[str, Any]:
        out: dict[str, Any] = {"login": self.access.login, "enabled": self.access.enabled,
                               "models": self.serving.models()}  # fmt: skip
        try:
            who = self.access.browser_user(request)
        except ApiError as exc:
            out["error"] = error_body(exc, _locale(request))[1]["error"]
            return out
        return out | {"user": who.user, "role": who.role, "limits": self.service.cfg.api.limits(who.user).model_dump()}

    async def usage(self, who: Caller, everyone: bool) -> dict[str, Any]:
        if everyone and who.role != "admin":
            raise ApiError.of("api.not_admin", name=who.user)
        if self.quotas is None:
            raise self.problem or ApiError.of("api.off")
        rows = await self.quotas.usage(None if everyone else who.user)
        return {"usage": [row.json() for row in rows]}

    def routes(self) -> list[BaseRoute]:
        router = APIRouter()

        @router.get("/v1/models")
        async def models(request: Request) -> Response:
            try:
                await self.access.caller(request)
            except ServiceError as exc:
                return refusal(exc, request)
            return JSONResponse(models_json(self.serving.models()))

        @router.post("/v1/chat/completions")
        async def completions(request: Request) -> Response:
            return await self.complete(request)

        def guarded(route: Callable[..., Any]) -> Callable[..., Any]:
            async def wrapped(request: Request, **kwargs: Any) -> Response:
                try:
                    return JSONResponse(*await route(self.access.browser_user(request), **kwargs))
                except ServiceError as exc:
                    return refusal(exc, request)

            return wrapped

        async def list_keys(who: Caller) -> tuple[Any, int]:
            return {"keys": [k.json() for k in await self._ready().list(who.user)]}, 200

        async def usage(who: Caller, everyone: bool) -> tuple[Any, int]:
            return await self.usage(who, everyone), 200

        async def revoke(who: Caller, key_id: str) -> tuple[Any, int]:
            return {"revoked": (await self._ready().revoke(key_id, who.user)).json()}, 200

        @router.post(PAGE_API + "/keys")
        async def create(request: Request, body: KeyName) -> Response:
            try:
                who = self.access.browser_user(request)
                key, info = await self._ready().create(who.user, body.name)
            except ServiceError as exc:
                return refusal(exc, request)
            log.info("API key %s made for %s", info.id, who.user)
            return JSONResponse({"key": key, **info.json()}, status_code=201)

        @router.get(PAGE_API + "/me")
        async def me(request: Request) -> Response:
            return JSONResponse(await self.me(request))

        async def list_route(request: Request) -> Response:
            return await guarded(list_keys)(request)

        async def usage_route(request: Request, everyone: bool = False) -> Response:
            return await guarded(usage)(request, everyone=everyone)

        async def revoke_route(request: Request, key_id: str) -> Response:
            return await guarded(revoke)(request, key_id=key_id)

        async def page() -> FileResponse:
            return FileResponse(STATIC / "keys.html", headers={"Cache-Control": "no-cache"})

        router.add_api_route(PAGE_API + "/keys", list_route, methods=["GET"])
        router.add_api_route(PAGE_API + "/usage", usage_route, methods=["GET"])
        router.add_api_route(PAGE_API + "/keys/{key_id}", revoke_route, methods=["DELETE"])
        router.add_api_route(PAGE, page, methods=["GET"], include_in_schema=False)
        return [
            *router.routes,
            *document_routes(self.access, lambda: self.library, refusal),
            Mount(PAGE + "/static", StaticFiles(directory=STATIC)),
        ]
