"""HTTP endpoints the app adds beside Chainlit's: /healthz (JSON state of the app and its engine), /livez (the
process serves pages: for a proxy in front of several app processes),
/metrics (the app's Prometheus metrics), /metrics/engine (the engine's own, passed through) and the template
workshop (/workshop, backend.workshop.api), the API for tools (/v1, /api-keys: backend.api), and Chainlit's own
routes that the app takes over (backend.web.chainlit_routes).

/metrics, /metrics/engine and the detail of /healthz answer this machine only (web.monitoring, web.monitoring_token):
they tell who uses the app how much, and the engine's addresses and errors; /livez and the status of /healthz answer
everyone (a proxy's or a container's health check)."""

from __future__ import annotations

import hmac
import logging

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from backend.api.logins import Logins
from backend.api.router import Gateway
from backend.chat.service import ChatService
from backend.config import WebSettings
from backend.errors import RequestRefusedError
from backend.ops.health import health_payload
from backend.ops.metrics import CONTENT_TYPE, METRICS, AppMetrics
from backend.web.chainlit_routes import feedback_routes, login_routes
from backend.web.guard import AUTH_COOKIE, GuardState, refusal_body
from backend.web.login import login_user, token_user
from backend.web.sign_in import SignIn
from backend.workshop.access import local_request
from backend.workshop.api import workshop_routes

log = logging.getLogger(__name__)


MAX_SOCKET_MESSAGE_BYTES = 8 * 1024 * 1024


def monitoring_refusal(request: Request, settings: WebSettings) -> RequestRefusedError | None:
    """Why this request may not read the metrics and the health detail, or None (web.monitoring)."""
    token = settings.monitoring_token.get_secret_value() if settings.monitoring_token else ""
    if token and hmac.compare_digest(request.headers.get("authorization", ""), f"Bearer {token}"):
        return None
    if settings.monitoring == "anyone" or local_request(request):
        return None
    return RequestRefusedError.of("web.monitoring", host=request.client.host if request.client else "?")


def _refused(exc: RequestRefusedError, request: Request) -> JSONResponse:
    return JSONResponse(refusal_body(exc, 403, request.headers.get("accept-language", "en"), api=False), 403)


async def engine_metrics(service: ChatService, timeout_s: float = 5.0) -> Response:
    """The engine's /metrics text, or 503 with a comment saying why it is not available."""
    url = service.endpoint.base_url + "/metrics"
    headers = service.endpoint.headers
    try:
        async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as http:
            resp = await http.get(url, headers=headers)
    except httpx.HTTPError as exc:
        return PlainTextResponse(f"# engine metrics unavailable: {type(exc).__name__} at {url}\n", status_code=503)
    if resp.status_code != 200:
        return PlainTextResponse(f"# engine metrics unavailable: HTTP {resp.status_code} at {url}\n", status_code=503)
    return Response(resp.content, media_type=resp.headers.get("content-type", CONTENT_TYPE))


def install_routes(
    service: ChatService,
    app: FastAPI | None = None,
    metrics: AppMetrics = METRICS,
    api: Gateway | None = None,
    guard: GuardState | None = None,
    sign_in: SignIn | None = None,
) -> None:
    """Add our routes in front of Chainlit's (its catch-all page route, and those the app takes over); with login and
    the database open, logins are throttled and a logout ends its session for `guard` too."""
    if app is None:
        from chainlit.server import app as chainlit_app
        from chainlit.server import sio

        app = chainlit_app
        # Socket.IO drops the connection on a message over 1 MB, silently for the user. Accept up to
        # 8 MB so an oversized message reaches the app and gets a clear answer (chat.max_input_chars).
        sio.eio.max_http_buffer_size = MAX_SOCKET_MESSAGE_BYTES

    settings = service.cfg.web

    async def healthz(request: Request) -> JSONResponse:
        payload = health_payload(service)
        status = 200 if payload["status"] == "ok" else 503
        if monitoring_refusal(request, settings) is not None:
            return JSONResponse({"status": payload["status"]}, status_code=status)  # the detail: this machine only
        return JSONResponse(payload, status_code=status)

    async def livez() -> JSONResponse:
        # The process serves pages, whatever its engine does: what a proxy in front of several app processes checks,
        # so that with every engine down users still reach the chat, which says what the engine is doing. While it
        # drains for a restart (backend.ops.drain), 503: the proxy sends new sessions to another process.
        if service.restarting() is not None:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "alive"})

    async def app_metrics(request: Request) -> Response:
        if (refused := monitoring_refusal(request, settings)) is not None:
            return _refused(refused, request)
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    async def proxied_engine_metrics(request: Request) -> Response:
        if (refused := monitoring_refusal(request, settings)) is not None:
            return _refused(refused, request)
        return await engine_metrics(service)

    routes: list[BaseRoute] = [
        APIRoute("/healthz", healthz, methods=["GET"]),
        APIRoute("/livez", livez, methods=["GET"]),
        APIRoute("/metrics", app_metrics, methods=["GET"]),
        APIRoute("/metrics/engine", proxied_engine_metrics, methods=["GET"]),
        *workshop_routes(service, login_user, service.quota.place, api.access.accounts if api else None),
        *(api.routes() if api is not None else []),
        *taken_over(service, api, guard, sign_in),
        *(sign_in.routes() if sign_in is not None else []),
    ]
    existing = {_key(r) for r in app.router.routes if getattr(r, "ernie", False)}
    for route in reversed(routes):
        if _key(route) not in existing:  # installed once, whatever Chainlit has at the same path
            route.ernie = True  # type: ignore[attr-defined]
            app.router.routes.insert(0, route)


def _key(route: BaseRoute) -> tuple[str | None, frozenset[str]]:
    return getattr(route, "path", None), frozenset(getattr(route, "methods", None) or ())


def taken_over(
    service: ChatService, api: Gateway | None, guard: GuardState | None, sign_in: SignIn | None = None
) -> list[BaseRoute]:
    """Chainlit's routes the app takes over: feedback on one's own replies only; with login and the database open,
    throttled logins and logouts that end the session on the server (the guard then refuses an ended session)."""
    routes: list[BaseRoute] = [*feedback_routes()] if service.cfg.auth.enabled else []
    if service.cfg.auth.enabled and api is not None and api.db is not None and api.problem is None:
        from chainlit.config import config as chainlit_config

        logins = Logins(api.db, service.cfg.auth.throttle, chainlit_config.project.user_session_timeout)
        cookie = guard.auth_cookie if guard is not None else AUTH_COOKIE
        routes += login_routes(logins, cookie)
        if guard is not None:
            accounts = api.access.accounts

            async def removed(name: str) -> bool:
                if accounts is None:
                    return False
                return (accounts.role(name) if sign_in is None else await sign_in.role_now(name)) is None

            async def ended(token: str) -> bool:
                """A session ended by its logout, or by its user's removal from the users file (or from the
                organisation's allowed groups)."""
                name = token_user(token)
                return name is None or await removed(name) or await logins.ended(token)

            guard.ended = ended
    elif service.cfg.auth.enabled:
        log.error("Logins are not throttled and a logout does not end its session: the database is not open.")
    return routes
