"""What every request to the app's port passes before it reaches Chainlit's routes or ours: one ASGI middleware around
Chainlit's FastAPI app (docs/security.md says what it protects against, and what a deployment must add).

- Another site's page is refused (403): a request whose Origin is neither its own Host nor one of web.origins, and
  any request the browser marks cross-site or same-site (Sec-Fetch-Site) that is not a top-level navigation. The
  chat's websocket included: Chainlit's CORS setting answers a listed origin with credentials allowed, and a
  websocket knows no CORS at all, while the login cookie (SameSite=Lax) goes along to every port of the same host.
- A body over its limit is refused (413) before anything parses or counts it, and no more of it is held than the limit:
  by its Content-Length, or as its bytes arrive (web.max_api_body_kb for /v1, web.max_body_kb elsewhere; the chat's
  socket keeps Engine.IO's own). The rest is read and dropped, up to 64 MB and 10 s, before the answer: a client that
  reads the answer only once it has sent its body (Python's httpx, the OpenAI SDK) gets the 413, not a broken
  connection it would send again; a larger body, or one sent after "Expect: 100-continue", is answered at once.
- A login token whose session was ended (a logout: backend.api.logins) is taken off the request: no route sees it.
- Every response carries the security headers (no framing, no type sniffing, a content security policy, referrers and
  resources kept to the app's own origin; HSTS over HTTPS), and a cookie set over HTTPS is Secure.
- A client that goes away before its request was read is one line in the log, not a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend.api.protocol import error_json
from backend.config import AppConfig, WebSettings, load_config
from backend.errors import ConfigError, RequestRefusedError, ServiceError
from backend.web.page import inline_script_hashes

log = logging.getLogger(__name__)

API_PREFIX = "/v1/"
SOCKET_PREFIX = "/ws/socket.io"  # Engine.IO checks its own limit (backend.web.routes.MAX_SOCKET_MESSAGE_BYTES)
OWN_PAGES = ("/api-keys", "/workshop")  # our own pages: no inline script, no eval
NO_BODY = {"GET", "HEAD", "OPTIONS"}
AUTH_COOKIE = "access_token"  # Chainlit's login cookie (chainlit.auth.cookie; CHAINLIT_AUTH_COOKIE_NAME)
HSTS = "max-age=31536000"
DRAIN_BYTES = 64 * 1024 * 1024  # of a body over its limit, read and dropped at most, before the 413
DRAIN_S = 10.0

# Our own pages (the key page, the workshop): their scripts and styles are files of their own.
OWN_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


def page_policy(inline_hashes: list[str]) -> str:
    """The content security policy of Chainlit's page: its own files, its inline scripts by hash, and eval, which
    Chainlit's custom elements need (public/elements/*.jsx are compiled in the browser); styles inline (React)."""
    hashes = "".join(f" 'sha256-{h}'" for h in inline_hashes)
    return (
        f"default-src 'self'; script-src 'self' 'unsafe-eval'{hashes}; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; media-src 'self' data: blob:; "
        "worker-src 'self' blob:; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
    )


SessionCheck = Callable[[str], Awaitable[bool]]  # whether the session of this login token was ended


@dataclass
class GuardState:
    """The guard's settings and what it learns at the app's start (the ended-sessions check, the page's scripts)."""

    settings: WebSettings
    page_policy: str = field(default_factory=lambda: page_policy([]))
    ended: SessionCheck | None = None  # set once the database is open (backend.api.logins)
    auth_cookie: str = AUTH_COOKIE
    drain_bytes: int = DRAIN_BYTES
    drain_s: float = DRAIN_S

    @classmethod
    def from_config(cls, cfg: AppConfig | None = None) -> GuardState:
        if cfg is None:
            try:
                cfg = load_config()
            except ConfigError:  # the chat reports it; the guard keeps its defaults
                cfg = AppConfig()
        return cls(cfg.web)


def foreign_origin(headers: Headers, allowed: list[str]) -> str | None:
    """The Origin of a request made by another site's page, or None (no Origin, the Host's own, or one of `allowed`)."""
    origin = headers.get("origin")
    if origin is None:
        return None
    if origin != "null" and urlsplit(origin).netloc == headers.get("host", ""):
        return None
    return None if origin.rstrip("/").lower() in {a.rstrip("/").lower() for a in allowed} else origin


def cross_site(headers: Headers) -> str | None:
    """What the browser says of a cross-site request that is not a top-level navigation (Fetch Metadata), or None."""
    site = headers.get("sec-fetch-site")
    if site in ("cross-site", "same-site") and headers.get("sec-fetch-mode") != "navigate":
        return f"another site ({site})"
    return None


def body_limit(path: str, settings: WebSettings) -> tuple[int, str] | None:
    """(bytes, the setting) a request body to `path` may have; None where another limit applies (the socket)."""
    if path.startswith(SOCKET_PREFIX):
        return None
    if path.startswith(API_PREFIX):
        return settings.max_api_body_kb * 1024, "web.max_api_body_kb"
    return settings.max_body_kb * 1024, "web.max_body_kb"


def refusal_body(exc: ServiceError, status: int, locale: str, api: bool) -> dict[str, Any]:
    """The JSON of a refusal: an OpenAI error object for the API, else {"error": {code, message, hint}} as the key page
    and the workshop read it (with "detail", which Chainlit's page shows)."""
    if api:
        return error_json(status, exc.code or exc.key, exc.text(locale))
    message, hint = exc.localized(locale)
    return {"error": {"code": exc.code, "message": message, "hint": hint}, "detail": exc.text(locale)}


def _cookie_name(part: str) -> str:
    return part.split("=", 1)[0].strip()


def without_cookies(headers: list[tuple[bytes, bytes]], name: str) -> list[tuple[bytes, bytes]]:
    """The headers less the cookie `name` (and its chunks, name_0, name_1...) in every Cookie header."""
    kept: list[tuple[bytes, bytes]] = []
    for key, value in headers:
        if key.lower() == b"cookie":
            parts = [p for p in value.decode("latin-1").split(";") if p.strip()]
            left = [p for p in parts if not (_cookie_name(p) == name or _cookie_name(p).startswith(name + "_"))]
            if left:
                kept.append((key, ";".join(left).strip().encode("latin-1")))
            continue
        kept.append((key, value))
    return kept


def login_token(headers: Headers, name: str) -> str | None:
    """The Chainlit login token a request carries: its cookie (or the cookie's chunks), else a Bearer JWT."""
    cookies: dict[str, str] = {}
    for value in headers.getlist("cookie"):
        for part in value.split(";"):
            if "=" in part:
                key, _, val = part.partition("=")
                cookies[key.strip()] = val.strip()
    if token := cookies.get(name):
        return token
    chunks: list[str] = []
    while (chunk := cookies.get(f"{name}_{len(chunks)}")) is not None:
        chunks.append(chunk)
    if chunks:
        return "".join(chunks)
    bearer = headers.get("authorization", "")
    token = bearer[7:].strip() if bearer.lower().startswith("bearer ") else ""
    return token if token.count(".") == 2 else None  # a JWT; an API key is no JWT


def secure_cookie(value: bytes) -> bytes:
    """A Set-Cookie value with the Secure attribute."""
    attributes = [a.strip().lower() for a in value.decode("latin-1").split(";")[1:]]
    return value if "secure" in attributes else value + b"; Secure"


class Guard:
    """The ASGI middleware (added to Chainlit's app before it starts: install())."""

    def __init__(self, app: ASGIApp, state: GuardState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path: str = scope.get("path", "")
        settings = self.state.settings
        where = foreign_origin(headers, settings.origins) or cross_site(headers)
        if where is not None:
            log.info("Refused %s %s from a page at %s", scope.get("method", "websocket"), path, where)
            await self._refuse(scope, receive, send, RequestRefusedError.of("web.foreign_origin", origin=where), 403)
            return
        scope = await self._without_ended_session(scope, headers)
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        if (limited := await self._read_body(scope, receive, send, headers, path)) is None:
            return  # refused, or the client went away
        try:
            await self.app(scope, limited, self._secured(scope, send, path))
        except ClientDisconnect:
            log.info("%s %s: the client went away", scope.get("method"), path)

    async def _without_ended_session(self, scope: Scope, headers: Headers) -> Scope:
        """The scope without a login token whose session was ended (its routes then see no login)."""
        check = self.state.ended
        token = login_token(headers, self.state.auth_cookie) if check is not None else None
        if check is None or token is None or not await check(token):
            return scope
        kept = without_cookies(list(scope["headers"]), self.state.auth_cookie)
        kept = [(k, v) for k, v in kept if not (k.lower() == b"authorization" and token.encode() in v)]
        return {**scope, "headers": kept}

    async def _read_body(
        self, scope: Scope, receive: Receive, send: Send, headers: Headers, path: str
    ) -> Receive | None:
        """A receive that gives the app the whole body, read here within its limit; None when it was refused (413)
        or the client went away."""
        limit = body_limit(path, self.state.settings)
        declared = headers.get("content-length")
        if limit is None or (scope.get("method") in NO_BODY and declared in (None, "0") and
                             "transfer-encoding" not in headers):  # fmt: skip
            return receive
        most, setting = limit
        size = int(declared) if declared is not None and declared.isdigit() else None
        if size is not None and size > most:
            if size <= self.state.drain_bytes and headers.get("expect", "").lower() != "100-continue":
                if not await self._drained(scope, receive, 0):
                    return None
            await self._too_large(scope, receive, send, size, most, setting)
            return None
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                log.info("%s %s: the client went away while sending its request", scope.get("method"), path)
                return None
            body += message.get("body", b"")
            more = bool(message.get("more_body", False))
            if len(body) > most:
                if more and not await self._drained(scope, receive, len(body)):
                    return None
                await self._too_large(scope, receive, send, len(body), most, setting)
                return None
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        return replay

    async def _drained(self, scope: Scope, receive: Receive, read: int) -> bool:
        """Read and drop the rest of a refused body, within DRAIN_BYTES and DRAIN_S; False when the client went away."""
        try:
            async with asyncio.timeout(self.state.drain_s):
                while read <= self.state.drain_bytes:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        log.info(
                            "%s %s: the client went away while sending its request", scope["method"], scope["path"]
                        )
                        return False
                    read += len(message.get("body", b""))
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            pass  # answered now; the client may see the connection close before it has sent everything
        return True

    async def _too_large(self, scope: Scope, receive: Receive, send: Send, size: int, most: int, setting: str) -> None:
        log.info("Refused %s %s: a body of %d bytes (%s: %d)", scope.get("method"), scope.get("path"), size, setting,
                 most)  # fmt: skip
        exc = RequestRefusedError.of("web.too_large", size_kb=-(-size // 1024), limit_kb=most // 1024, setting=setting)
        await self._refuse(scope, receive, send, exc, 413)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, exc: ServiceError, status: int) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # before the handshake: the server answers 403
            return
        locale = Headers(scope=scope).get("accept-language", "en")
        refused = refusal_body(exc, status, locale, scope["path"].startswith(API_PREFIX))
        body = json.dumps(refused, ensure_ascii=False).encode()
        headers = [(b"content-type", b"application/json; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]  # fmt: skip
        secured = self._secured(scope, send, scope["path"])
        await secured({"type": "http.response.start", "status": status, "headers": headers})
        await secured({"type": "http.response.body", "body": body})

    def _secured(self, scope: Scope, send: Send, path: str) -> Send:
        """`send` with the security headers added to the response, and Secure added to its cookies over HTTPS."""
        https = self.state.settings.https or scope.get("scheme") == "https"
        policy = OWN_POLICY if path.startswith(OWN_PAGES) else self.state.page_policy
        added = [
            (b"x-content-type-options", b"nosniff"),
            (b"x-frame-options", b"DENY"),
            (b"referrer-policy", b"same-origin"),
            (b"cross-origin-opener-policy", b"same-origin"),
            (b"cross-origin-resource-policy", b"same-origin"),
            (b"content-security-policy", policy.encode()),
            *([(b"strict-transport-security", HSTS.encode())] if https else []),
        ]

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                out = [(k, secure_cookie(v) if https and k.lower() == b"set-cookie" else v)
                       for k, v in message.get("headers", [])]  # fmt: skip
                out += [(k, v) for k, v in added if k not in present]
                message = {**message, "headers": out}
            await send(message)

        return secured


def install(state: GuardState | None = None, app: Any = None) -> GuardState:
    """Put the guard around Chainlit's app (before it starts: at the import of app.py); return its state."""
    state = state or GuardState.from_config()
    if app is None:
        from chainlit.auth import cookie
        from chainlit.server import app

        state.auth_cookie = getattr(cookie, "_auth_cookie_name", AUTH_COOKIE)
        state.page_policy = page_policy(inline_script_hashes())
    for middleware in app.user_middleware:  # imported again (chainlit run -w): the running guard takes the settings
        if middleware.cls is Guard:
            running: GuardState = middleware.kwargs["state"]
            running.settings, running.page_policy = state.settings, state.page_policy
            return running
    app.add_middleware(Guard, state=state)
    return state
