"""The limits of an upload, enforced before Chainlit holds the file: Chainlit's upload route (POST /project/file)
reads the whole file into memory before any check of its own, and takes any size its settings allow.

A route in front of Chainlit's: a Content-Length over the limit is refused at once; the body is counted as it arrives
and written to a temporary file (never held whole), refused as soon as it passes the limit; the part's file name is
read from the first bytes, and a kind the library does not take, or a library that is full, is refused before the
rest is read. What passes is handed to Chainlit's own route from the temporary file, in pieces. Refusals are JSON
{"detail": ...} in the language of the request, which Chainlit's page shows."""

from __future__ import annotations

import json
import logging
import re
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, unquote

from starlette.routing import BaseRoute, Match, Route
from starlette.types import Message, Receive, Scope, Send

from backend.documents.extract import KINDS, kind_of
from backend.errors import DocumentError, ServiceError

log = logging.getLogger(__name__)

UPLOAD_PATH = "/project/file"
MULTIPART_SLACK = 64 * 1024  # the multipart form's own bytes around the file (boundaries, part headers, fields)
HEAD_BYTES = 16 * 1024  # the part headers (with the file name) are within this many bytes of the body's start
PIECE = 64 * 1024
FILENAME = re.compile(rb'filename\*?="?(?:UTF-8\'\')?([^"\r\n;]*)"?', re.IGNORECASE)
Check = Callable[[Scope], Awaitable[None]]  # raises DocumentError: the library will not take a file (full)


def _status(exc: ServiceError) -> int:
    return {"documents.upload_too_large": 413, "documents.bad_type": 415}.get(exc.code or "", 400)


def _locale(scope: Scope) -> str:
    headers = dict(scope.get("headers") or [])
    return headers.get(b"accept-language", b"en").decode("latin-1")


async def refuse(exc: ServiceError, scope: Scope, send: Send) -> None:
    body = json.dumps({"detail": exc.text(_locale(scope))}, ensure_ascii=False).encode()
    await send({"type": "http.response.start", "status": _status(exc),
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def file_name(head: bytes) -> str | None:
    """The file name of the first file part of a multipart body's first bytes, if they hold it."""
    found = FILENAME.search(head)
    if found is None:
        return None
    return unquote(found.group(1).decode("utf-8", "replace"))


class UploadGuard:
    """An ASGI app for Chainlit's upload route that enforces the library's limits first (see the module's text)."""

    def __init__(self, chainlit_route: BaseRoute, limit_bytes: int, limit_mb: str, check: Check) -> None:
        self.chainlit_route = chainlit_route
        self.limit_bytes = limit_bytes
        self.limit_mb = limit_mb
        self.check = check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        too_large = DocumentError.of("documents.upload_too_large", limit_mb=self.limit_mb)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit_bytes + MULTIPART_SLACK:
            await refuse(too_large, scope, send)
            return
        with tempfile.TemporaryFile() as spool:
            size, head, named = 0, b"", False
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.limit_bytes + MULTIPART_SLACK:
                    await refuse(too_large, scope, send)
                    return
                spool.write(chunk)
                if not named and (len(head) < HEAD_BYTES):
                    head += chunk[: HEAD_BYTES - len(head)]
                    name = file_name(head)
                    if name is not None or len(head) >= HEAD_BYTES or not message.get("more_body", False):
                        named = True
                        try:
                            await self._check_name(name, scope)
                        except ServiceError as exc:
                            await refuse(exc, scope, send)
                            return
                if not message.get("more_body", False):
                    break
            spool.seek(0)
            await self.chainlit_route.handle(scope, _replay(spool), send)

    async def _check_name(self, name: str | None, scope: Scope) -> None:
        if name is not None and kind_of(name) is None:
            raise DocumentError.of("documents.bad_type", name=name, kinds=", ".join(KINDS))
        await self.check(scope)


def _replay(spool: Any) -> Receive:
    """A receive() that gives the spooled body again, a piece at a time."""

    async def receive() -> Message:
        piece = spool.read(PIECE)
        return {"type": "http.request", "body": piece, "more_body": bool(piece)}

    return receive


def session_of(scope: Scope) -> str | None:
    """The Chainlit session id an upload names (its query's session_id)."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    found = query.get("session_id")
    return found[0] if found else None


def guard_uploads(routes: list[BaseRoute], limit_bytes: int, limit_mb: str, check: Check) -> BaseRoute | None:
    """Put an UploadGuard in front of Chainlit's upload route in `routes` (a router's list, changed in place);
    returns the guard's route, or None where Chainlit has no such route (a Chainlit upgrade: see its server.py)."""
    scope = {"type": "http", "path": UPLOAD_PATH, "method": "POST", "root_path": ""}
    original = next((r for r in routes if r.matches(scope)[0] == Match.FULL), None)
    if original is None:
        log.error("Chainlit has no upload route at %s: uploads are not limited", UPLOAD_PATH)
        return None
    guard = Route(UPLOAD_PATH, UploadGuard(original, limit_bytes, limit_mb, check), methods=["POST"])
    routes.insert(0, guard)
    return guard
