"""HTTP endpoints the app adds beside Chainlit's: /healthz (JSON state of the app and its engine)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

if TYPE_CHECKING:
    from backend.service import ChatService


def health_payload(service: ChatService) -> dict[str, Any]:
    """The app's view of itself and its engine (no secrets)."""
    st = service.supervisor.status
    return {
        "status": "ok" if service.supervisor.ready else "degraded",
        "engine": {
            "state": st.state.value,
            "for_s": round(st.elapsed_s, 1),
            "restarts": st.restarts,
            "pid": st.pid,
            "error": st.error,
            "base_url": service.endpoint.base_url,
            "model": service.endpoint.model,
            "note": st.note,
        },
    }


MAX_SOCKET_MESSAGE_BYTES = 8 * 1024 * 1024


def install_routes(service: ChatService, app: FastAPI | None = None) -> None:
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

    routes = [APIRoute("/healthz", healthz, methods=["GET"])]
    existing = {getattr(r, "path", None) for r in app.router.routes}
    for route in reversed(routes):
        if route.path not in existing:
            app.router.routes.insert(0, route)
