"""The chat page's own HTTP parts beside Chainlit's: the first page's status line (which model, engine and device
answer, and the engine's state), read by public/ernie.js in the reader's language."""

from __future__ import annotations

from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from backend.chat.render import serving_status
from backend.chat.service import ChatService

STATUS_PATH = "/ernie/status"


def install_page(service: ChatService, app: FastAPI | None = None) -> None:
    """Add the page's routes in front of Chainlit's catch-all page route."""
    if app is None:
        from chainlit.server import app as chainlit_app

        app = chainlit_app

    async def status(lang: str = Query("en-US", max_length=35)) -> JSONResponse:
        return JSONResponse(serving_status(service.serving(), lang), headers={"Cache-Control": "no-store"})

    if STATUS_PATH not in {getattr(r, "path", None) for r in app.router.routes}:
        app.router.routes.insert(0, APIRoute(STATUS_PATH, status, methods=["GET"]))
