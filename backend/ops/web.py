"""HTTP endpoints the app adds beside Chainlit's: /healthz (JSON state of the app and its engine), /livez (the
process serves pages: for a proxy in front of several app processes),
/metrics (the app's Prometheus metrics), /metrics/engine (the engine's own, passed through) and the template
workshop (/workshop, backend.workshop.api), and the API for tools (/v1, /api-keys: backend.api)."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from backend.api.router import Gateway
from backend.chat.service import ChatService
from backend.ops.metrics import CONTENT_TYPE, METRICS, AppMetrics
from backend.workshop.api import workshop_routes


def health_payload(service: ChatService) -> dict[str, Any]:
    """The app's view of itself and its engine (no secrets)."""
    st = service.supervisor.status
    draining = service.restarting() is not None
    return {
        "status": "draining" if draining else "ok" if service.supervisor.ready else "degraded",
        "engine": {
            "name": service.supervisor.spec.engine if service.supervisor.spec else None,
            "state": st.state.value,
            "for_s": round(st.elapsed_s, 1),
            "restarts": st.restarts,
            "pid": st.pid,
            "adopted": st.adopted,  # kept running by the app's last run and adopted (engine.keep_running)
            "error": st.error,
            "base_url": service.endpoint.base_url,
            "model": service.endpoint.model,
            "note": st.note,
        },
        # The canary (backend.serving.canary): which way of running the engine serves, what its answer check said,
        # and which ones were tried before and why they were dropped.
        "check": service.supervisor.canary.summary() if service.supervisor.canary else None,
        # The engine tune (backend.tuning): which engine and format measured fastest on this machine, and the figures.
        "tune": service.supervisor.tune,
        # The line in front of the engine (backend.chat.admission): its places (the engine's replies at once), who
        # runs and waits now, how many were told "busy", and the reply time its expected waits are made of.
        "line": line_payload(service),
    }


def line_payload(service: ChatService) -> dict[str, Any] | None:
    line = service.line()
    if line is None:
        return None
    return {
        "places": line.capacity,
        "running": len(line.running),
        "waiting": line.waiting,
        "refused": line.refused,
        "reply_s": round(line.reply_s, 1),
    }


MAX_SOCKET_MESSAGE_BYTES = 8 * 1024 * 1024


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
    service: ChatService, app: FastAPI | None = None, metrics: AppMetrics = METRICS, api: Gateway | None = None
) -> None:
    """Add our routes in front of Chainlit's catch-all page route."""
    if app is None:
        from chainlit.server import app as chainlit_app
        from chainlit.server import sio

        app = chainlit_app
        # Socket.IO drops the connection on a message over 1 MB, silently for the user. Accept up to
        # 8 MB so an oversized message reaches the app and gets a clear answer (chat.max_input_chars).
        sio.eio.max_http_buffer_size = MAX_SOCKET_MESSAGE_BYTES

    async def healthz() -> JSONResponse:
        payload = health_payload(service)
        return JSONResponse(payload, status_code=200 if payload["status"] == "ok" else 503)

    async def livez() -> JSONResponse:
        # The process serves pages, whatever its engine does: what a proxy in front of several app processes checks,
        # so that with every engine down users still reach the chat, which says what the engine is doing. While it
        # drains for a restart (backend.ops.drain), 503: the proxy sends new sessions to another process.
        if service.restarting() is not None:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "alive"})

    async def app_metrics() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    async def proxied_engine_metrics() -> Response:
        return await engine_metrics(service)

    routes: list[BaseRoute] = [
        APIRoute("/healthz", healthz, methods=["GET"]),
        APIRoute("/livez", livez, methods=["GET"]),
        APIRoute("/metrics", app_metrics, methods=["GET"]),
        APIRoute("/metrics/engine", proxied_engine_metrics, methods=["GET"]),
        *workshop_routes(service),
        *(api.routes() if api is not None else []),
    ]
    existing = {getattr(r, "path", None) for r in app.router.routes}
    for route in reversed(routes):
        if getattr(route, "path", None) not in existing:
            app.router.routes.insert(0, route)
