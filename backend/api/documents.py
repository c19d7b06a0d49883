"""The API's view of the caller's library of documents (docs/documents.md): `GET /v1/documents` lists them,
`DELETE /v1/documents/{id}` deletes one (its passages and terms with it). A key acts as its user, so it reaches that
user's documents only; without login there is no library for the API (documents belong to browser tabs). Answering
from the library is `"documents": true` on /v1/chat/completions (backend.api.serving)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from backend.api.access import ApiAccess
from backend.chat.sources import user_owner
from backend.documents.library import Library
from backend.errors import DocumentError, ServiceError

Refusal = Callable[[ServiceError, Request], Response]


def library_owner(user: str | None, documents_on: bool) -> str:
    """Whose documents an API caller reaches: the login user's own (`user`); DocumentError without login (None:
    documents belong to browser tabs there) or with documents off."""
    if user is None:
        raise DocumentError.of("documents.no_library")
    if not documents_on:
        raise DocumentError.of("documents.off")
    return user_owner(user)


def document_routes(access: ApiAccess, library: Callable[[], Library | None], refusal: Refusal) -> list[BaseRoute]:
    """The library's routes; `library` gives the app's library when documents are on (else None: documents.off)."""
    router = APIRouter()

    async def reach(request: Request) -> tuple[Library, str]:
        caller = await access.caller(request)
        found = library()
        owner = library_owner(caller.user if access.login else None, found is not None)
        assert found is not None
        return found, owner

    @router.get("/v1/documents")
    async def listed(request: Request) -> Response:
        try:
            found, owner = await reach(request)
            documents: list[dict[str, Any]] = [doc.json() for doc in await found.documents(owner)]
        except ServiceError as exc:
            return refusal(exc, request)
        return JSONResponse({"object": "list", "data": documents})

    @router.delete("/v1/documents/{doc_id}")
    async def deleted(request: Request, doc_id: str) -> Response:
        try:
            found, owner = await reach(request)
            await found.delete(owner, doc_id)
        except ServiceError as exc:
            return refusal(exc, request)
        return JSONResponse({"id": doc_id, "object": "document", "deleted": True})

    return list(router.routes)
