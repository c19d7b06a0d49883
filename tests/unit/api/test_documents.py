"""The API's routes of a caller's library (backend.api.documents) on a real library in an SQLite file: a key's user
lists and deletes their own documents only; without login, or with documents off, a clear refusal."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI, Request

from backend.api.access import Caller
from backend.api.documents import document_routes, library_owner
from backend.api.router import refusal
from backend.config import DocumentSettings
from backend.documents.index import DocumentIndex
from backend.documents.library import Library
from backend.errors import DocumentError


class KeyAccess:
    """Stands in for ApiAccess: the caller is the user the request's X-User header names."""

    def __init__(self, login: bool) -> None:
        self.login = login

    async def caller(self, request: Request) -> Caller:
        return Caller(request.headers.get("x-user", "local"))


@pytest_asyncio.fixture
async def library(tmp_path: Path) -> AsyncIterator[Library]:
    index = DocumentIndex(f"sqlite+aiosqlite:///{tmp_path / 'chat.db'}")
    await index.prepare()
    found = Library(index, DocumentSettings(), forget_after_s=60)
    yield found
    await found.close()


def client(library: Library | None, login: bool = True) -> httpx.AsyncClient:
    app = FastAPI()
    app.router.routes.extend(document_routes(KeyAccess(login), lambda: library, refusal))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")


async def test_a_user_lists_and_deletes_their_own_documents_only(library: Library) -> None:
    mine, _ = await library.add("user:alice", "notes.md", b"# Notes\nThe door is blue.\n")
    theirs, _ = await library.add("user:bob", "bob.md", b"# Bob\nThe gate is red.\n")
    async with client(library) as api:
        listed = (await api.get("/v1/documents", headers={"x-user": "alice"})).json()
        assert listed["object"] == "list" and [d["id"] for d in listed["data"]] == [mine.id]
        assert listed["data"][0] | {"created_at": ""} == mine.json() | {"created_at": ""}
        refused = await api.delete(f"/v1/documents/{theirs.id}", headers={"x-user": "alice"})
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "documents.not_found"
        assert [d.id for d in await library.documents("user:bob")] == [theirs.id], "bob's is still there"
        gone = await api.delete(f"/v1/documents/{mine.id}", headers={"x-user": "alice"})
        assert gone.json() == {"id": mine.id, "object": "document", "deleted": True}
        assert (await api.get("/v1/documents", headers={"x-user": "alice"})).json()["data"] == []
        assert await library.find("user:alice", "Which colour is the door?", 3) == []


async def test_without_login_or_with_documents_off_the_api_says_so(library: Library) -> None:
    async with client(library, login=False) as api:
        refused = await api.get("/v1/documents", headers={"Accept-Language": "zh-CN"})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "documents.no_library"
        assert "浏览器标签页" in refused.json()["error"]["message"]
    async with client(None) as api:
        off = await api.delete("/v1/documents/x", headers={"x-user": "alice"})
        assert off.status_code == 404 and off.json()["error"]["code"] == "documents.off"
    with pytest.raises(DocumentError) as raised:
        library_owner(None, documents_on=True)
    assert raised.value.code == "documents.no_library"
    assert library_owner("alice", documents_on=True) == "user:alice"
