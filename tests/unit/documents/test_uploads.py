"""The upload guard in front of Chainlit's upload route: a file over the limit, of a kind the library does not take, or
for a full library is refused before the route behind it reads anything; what passes reaches it whole."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Scope

from backend.documents.uploads import guard_uploads
from backend.errors import DocumentError

LIMIT = 100_000


def app_with_guard(full: bool = False) -> tuple[Starlette, list[int]]:
    received: list[int] = []  # what the route behind the guard read: the size of each body it got

    async def chainlit_upload(request: Request) -> JSONResponse:  # stands in for Chainlit's route
        async with request.form() as form:
            data = await form["file"].read()  # type: ignore[union-attr]
        received.append(len(data))
        return JSONResponse({"id": "1", "size": len(data)})

    async def check(scope: Scope) -> None:
        if full:
            raise DocumentError.of("documents.library_full", limit=20)

    routes = [Route("/project/file", chainlit_upload, methods=["POST"])]
    guard_uploads(routes, LIMIT, "0.1", check)
    return Starlette(routes=routes), received


async def post(app: Starlette, name: str, size: int, lang: str = "en") -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        files = {"file": (name, b"a" * size, "text/plain")}
        return await client.post("/project/file?session_id=s", files=files, headers={"Accept-Language": lang})


async def test_a_file_within_the_limit_reaches_the_route_whole() -> None:
    app, received = app_with_guard()
    response = await post(app, "notes.md", LIMIT)
    assert response.status_code == 200 and received == [LIMIT]


@pytest.mark.parametrize(("lang", "words"), [("en", "larger than the 0.1 MB"), ("zh-CN", "超过了单个文件 0.1 MB")])
async def test_a_file_over_the_limit_is_refused_before_the_route_reads_it(lang: str, words: str) -> None:
    app, received = app_with_guard()
    response = await post(app, "big.txt", 2 * LIMIT + 100_000, lang)
    assert response.status_code == 413 and words in response.json()["detail"]
    assert received == []


async def test_a_body_without_a_length_is_counted_as_it_arrives() -> None:
    app, received = app_with_guard()

    async def body():  # chunked: no Content-Length to refuse it by
        yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="x.txt"\r\n'
        yield b"Content-Type: text/plain\r\n\r\n"
        for _ in range(40):
            yield b"a" * 10_000

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        headers = {"Content-Type": "multipart/form-data; boundary=b"}
        response = await client.post("/project/file?session_id=s", content=body(), headers=headers)
    assert response.status_code == 413 and received == []


async def test_a_kind_the_library_does_not_take_and_a_full_library_are_refused() -> None:
    app, received = app_with_guard()
    response = await post(app, "movie.mp4", 1000, "zh-CN")
    assert response.status_code == 415 and "不是文档库接受的文件类型" in response.json()["detail"]
    full, received_full = app_with_guard(full=True)
    refused = await post(full, "notes.md", 1000)
    assert refused.status_code == 400 and "already holds 20 documents" in refused.json()["detail"]
    assert received == [] and received_full == []
