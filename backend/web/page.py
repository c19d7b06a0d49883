"""The chat page as this app serves it: Chainlit's page without links to other hosts (a self-hosted chat loads
nothing from elsewhere: offline it would fail, online it tells a third party who chats), and the first page's
status line (which model, engine and device answer, and the engine's state), read by public/ernie.js in the
reader's language (with login on, by logged-in users only, as the chat itself)."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from backend.chat.render import serving_status
from backend.chat.service import ChatService
from backend.web.login import login_user

STATUS_PATH = "/ernie/status"
# What Chainlit 2.12's index.html asks of other hosts: KaTeX's stylesheet on cdn.jsdelivr.net (math is off:
# features.latex) and preconnects to Google Fonts (the font itself is off: public/theme.json custom_fonts).
_OTHER_HOST_LINK = re.compile(r"<link\b[^>]*\bhref=\"(?:https?:)?//[^\"]*\"[^>]*>\s*", re.IGNORECASE)


_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)  # no src: its text is the script


def self_contained(html: str) -> str:
    """The page without the links that load something from another host."""
    return _OTHER_HOST_LINK.sub("", html)


def inline_script_hashes(html: str | None = None) -> list[str]:
    """The SHA-256 (base64) of each inline script of Chainlit's page (`html`, default the page as served now): what
    the page's content security policy lets run (backend.web.guard)."""
    if html is None:
        import chainlit.server as chainlit_server

        html = chainlit_server.get_html_template(chainlit_server.config.run.root_path)
    scripts = _INLINE_SCRIPT.findall(html)
    return sorted({base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() for script in scripts})


def own_files_folder(folder: Path) -> None:
    """Keep Chainlit's session files (elements, uploads) in `folder`, this process's own. Chainlit keeps them under
    <project>/.files and deletes that folder as it stops: two app processes started from one folder (a fleet on one
    machine) shared it, so a rolling restart of one deleted the files of the other's sessions, and the other's next
    reply failed ("No such file or directory"). Each process keeps its own, in its data folder."""
    import chainlit.config as chainlit_config
    import chainlit.server as chainlit_server

    folder.mkdir(parents=True, exist_ok=True)
    chainlit_config.FILES_DIRECTORY = folder  # sessions look it up here at each use (Session.files_dir)
    chainlit_server.FILES_DIRECTORY = folder  # the server's own copy: the folder it deletes as it stops


def install_page(service: ChatService, app: FastAPI | None = None) -> None:
    """Add the status route in front of Chainlit's routes, and serve Chainlit's page self-contained."""
    import chainlit.server as chainlit_server

    app = app or chainlit_server.app

    async def status(request: Request, lang: str = Query("en-US", max_length=35)) -> JSONResponse:
        if service.cfg.auth.enabled and login_user(request) is None:  # with login on, for logged-in users only
            return JSONResponse({"detail": "Not authenticated"}, status_code=401)
        return JSONResponse(serving_status(service.serving(), lang), headers={"Cache-Control": "no-store"})

    routes = app.router.routes
    if STATUS_PATH not in {getattr(r, "path", None) for r in routes}:
        routes.insert(0, APIRoute(STATUS_PATH, status, methods=["GET"]))
    # Chainlit's page route (server.serve) sits in an included router whose routes FastAPI caches, so it cannot be
    # swapped; it looks its template function up at every request: the page is made self-contained there.
    template = chainlit_server.get_html_template
    if not getattr(template, "self_contained", False):

        def page_template(root_path: str) -> str:
            return self_contained(template(root_path))

        page_template.self_contained = True  # type: ignore[attr-defined]
        chainlit_server.get_html_template = page_template
