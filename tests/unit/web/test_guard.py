"""The guard every request passes (backend/web/guard.py), around a small app of its own that records what reaches it:
another site's page refused (its Origin, or the browser's Fetch Metadata) and the websocket too; a body over its limit
refused before the app reads a byte, by its Content-Length or as it arrives; an ended session's token taken off the
request; the security headers on every response and Secure cookies over HTTPS; a client gone mid-request in one
line. The real app behind it: tests/integration/test_security.py and tests/browser/test_cross_origin.py."""

from __future__ import annotations

import base64
import hashlib
import logging
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from backend.config import WebSettings
from backend.web.guard import Guard, GuardState, login_token, without_cookies
from backend.web.page import inline_script_hashes

HOST = "127.0.0.1:8501"


class Inner:
    """The app behind the guard: records each request's body and login cookie."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def echo(self, request: Request) -> JSONResponse:
        body = await request.body()
        self.seen.append({"path": request.url.path, "size": len(body), "cookies": dict(request.cookies),
                          "authorization": request.headers.get("authorization")})  # fmt: skip
        response = JSONResponse({"size": len(body)})
        if request.url.path == "/":
            response.set_cookie("access_token", "new", httponly=True)  # a login's answer
        return response

    async def socket(self, websocket: WebSocket) -> None:
        self.seen.append({"path": "socket"})
        await websocket.accept()
        await websocket.close()

    def app(self) -> Starlette:
        routes = [Route("/{path:path}", self.echo, methods=["GET", "POST", "PUT"]), WebSocketRoute("/ws", self.socket)]
        return Starlette(routes=routes)


def guarded(**settings: Any) -> tuple[Inner, Guard, GuardState]:
    inner = Inner()
    state = GuardState(WebSettings(**settings))
    return inner, Guard(inner.app(), state), state


def client(guard: Guard, scheme: str = "http") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=guard), base_url=f"{scheme}://{HOST}")


async def test_another_sites_page_is_refused_and_the_apps_own_is_not() -> None:
    inner, guard, _ = guarded(origins=["https://chat.example.com"])
    async with client(guard) as http:
        foreign = await http.post("/project/threads", json={}, headers={"Origin": "http://127.0.0.1:9999"})
        assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "web.foreign_origin"
        assert "http://127.0.0.1:9999" in foreign.json()["detail"]
        zh = await http.post("/x", headers={"Origin": "null", "Accept-Language": "zh-CN"})
        assert zh.status_code == 403 and "本应用只响应它自己的页面" in zh.json()["error"]["message"]
        api = await http.post("/v1/chat/completions", json={}, headers={"Origin": "http://evil.example"})
        assert api.json()["error"]["type"] and api.json()["error"]["code"] == "web.foreign_origin", "an OpenAI error"
        cross = await http.get("/project/thread/1", headers={"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors"})
        assert cross.status_code == 403, "a fetch the browser marks same-site (another port of this host)"
        assert not inner.seen, "none of them reached the app"
        own = await http.post("/x", json={}, headers={"Origin": f"http://{HOST}", "Sec-Fetch-Site": "same-origin"})
        listed = await http.post("/x", json={}, headers={"Origin": "https://chat.example.com/"})
        link = await http.get("/", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"})
        tool = await http.post("/x", json={})  # no Origin: not a browser's page
        assert [r.status_code for r in (own, listed, link, tool)] == [200] * 4
        assert len(inner.seen) == 4


async def test_another_sites_websocket_is_refused_before_its_handshake() -> None:
    inner, guard, _ = guarded()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "websocket", "path": "/ws", "headers": [(b"host", HOST.encode()),
             (b"origin", b"http://127.0.0.1:9999")], "query_string": b"", "scheme": "ws"}  # fmt: skip
    await guard(scope, receive, send)
    assert sent == [{"type": "websocket.close", "code": 1008}] and not inner.seen  # the server answers 403


class Client:
    """A client's side of one request: `chunks` bodies of 512 bytes (endless: None), and what it was answered."""

    def __init__(self, chunks: int | None = None) -> None:
        self.chunks, self.reads, self.sent = chunks, 0, []  # type: ignore[var-annotated]

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        more = self.chunks is None or self.reads < self.chunks
        return {"type": "http.request", "body": b"x" * 512, "more_body": more}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def answer(self) -> tuple[int, str]:
        return self.sent[0]["status"], self.sent[1]["body"].decode()


def scope_of(path: str, **headers: str) -> dict[str, Any]:
    pairs = [(b"host", HOST.encode()), *((k.replace("_", "-").encode(), v.encode()) for k, v in headers.items())]
    return {"type": "http", "method": "POST", "path": path, "headers": pairs, "query_string": b""}


@pytest.mark.parametrize(("path", "setting"), [("/v1/chat/completions", "max_api_body_kb"), ("/x", "max_body_kb")])
async def test_a_body_over_its_limit_is_refused_before_it_is_held(path: str, setting: str) -> None:
    inner, guard, state = guarded(max_body_kb=1, max_api_body_kb=2)
    state.drain_bytes = 16 * 1024
    limit = 2048 if setting == "max_api_body_kb" else 1024
    huge = Client()  # announces more than is ever read and dropped: answered before a byte is read
    await guard(scope_of(path, content_length=str(state.drain_bytes + 1)), huge.receive, huge.send)
    status, body = huge.answer()
    assert (status, huge.reads) == (413, 0) and f"web.{setting}" in body and "web.too_large" in body
    waiting = Client()  # asks first (Expect: 100-continue): answered at once, it sends nothing
    await guard(scope_of(path, content_length=str(limit + 1), expect="100-continue"), waiting.receive, waiting.send)
    assert (waiting.answer()[0], waiting.reads) == (413, 0)
    sending = Client(chunks=8)  # a client that reads its answer once it has sent all: the rest is read and dropped
    await guard(scope_of(path, content_length=str(8 * 512)), sending.receive, sending.send)
    assert (sending.answer()[0], sending.reads) == (413, 8)
    endless = Client()  # no Content-Length, and it never stops: cut once as much as is ever dropped was read
    await guard(scope_of(path, transfer_encoding="chunked"), endless.receive, endless.send)
    assert endless.answer()[0] == 413 and endless.reads == state.drain_bytes // 512 + 1
    assert not inner.seen


async def test_a_body_within_its_limit_reaches_the_app_whole() -> None:
    inner, guard, _ = guarded(max_body_kb=1)
    async with client(guard) as http:
        assert (await http.post("/x", content=b"y" * 1024)).json() == {"size": 1024}
        assert (await http.post("/v1/chat/completions", content=b"y" * 4096)).json() == {"size": 4096}
    assert [s["size"] for s in inner.seen] == [1024, 4096]


async def test_a_client_gone_while_sending_is_one_line(caplog: pytest.LogCaptureFixture) -> None:
    inner, guard, _ = guarded()
    messages = iter([{"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}])

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def send(message: dict[str, Any]) -> None:
        raise AssertionError("nothing is answered to a client that went away")

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "query_string": b"",
             "headers": [(b"host", HOST.encode()), (b"content-length", b"100")]}  # fmt: skip
    with caplog.at_level(logging.INFO, logger="backend.web.guard"):
        await guard(scope, receive, send)
    assert [r.getMessage() for r in caplog.records] == [
        "POST /v1/chat/completions: the client went away while sending its request"
    ]
    assert not inner.seen


async def test_an_ended_session_is_taken_off_the_request() -> None:
    inner, guard, state = guarded()
    ended = {"ended.token.jwt"}

    async def check(token: str) -> bool:
        return token in ended

    state.ended = check
    async with client(guard) as http:
        await http.get("/x", headers={"Cookie": "access_token=ended.token.jwt; ernie_tab=t1"})
        await http.get("/x", headers={"Cookie": "access_token_0=ended.token; access_token_1=.jwt"})
        await http.get("/x", headers={"Authorization": "Bearer ended.token.jwt"})
        await http.get("/x", headers={"Cookie": "access_token=live.token.jwt"})
    assert [s["cookies"] for s in inner.seen] == [{"ernie_tab": "t1"}, {}, {}, {"access_token": "live.token.jwt"}]
    assert inner.seen[2]["authorization"] is None


def test_login_tokens_and_cookies_are_read_as_chainlit_writes_them() -> None:
    assert login_token(Headers({"cookie": "a=1; access_token=x.y.z"}), "access_token") == "x.y.z"
    assert login_token(Headers({"authorization": "Bearer sk-ernie-key"}), "access_token") is None, "an API key"
    kept = without_cookies([(b"Cookie", b"access_token=1; other=2"), (b"host", b"h")], "access_token")
    assert kept == [(b"Cookie", b"other=2"), (b"host", b"h")]


async def test_every_response_carries_the_security_headers_and_https_cookies_are_secure() -> None:
    _, guard, state = guarded()
    state.page_policy = "default-src 'self'; script-src 'self' 'unsafe-eval'; frame-ancestors 'none'"
    async with client(guard) as http:
        page, keys = await http.get("/"), await http.get("/api-keys")
        refused = await http.post("/x", headers={"Origin": "http://evil.example"})
    for response in (page, keys, refused):
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "same-origin"
        assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
        assert "strict-transport-security" not in response.headers
    assert "unsafe-eval" not in keys.headers["content-security-policy"], "our own pages run no eval"
    assert "Secure" not in page.headers["set-cookie"]
    async with client(guard, scheme="https") as http:
        secure = await http.get("/")
    assert (
        secure.headers["set-cookie"].endswith("; Secure") and "max-age" in secure.headers["strict-transport-security"]
    )
    _, guard, _ = guarded(https=True)
    async with client(guard) as http:
        assert (await http.get("/")).headers["set-cookie"].endswith("; Secure"), "web.https: behind a proxy"


def test_the_pages_inline_scripts_are_allowed_by_their_hashes() -> None:
    html = "<script>const global = globalThis;</script><script type=module src=/a.js></script><script>x</script>"
    expected = {
        base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() for s in ("const global = globalThis;", "x")
    }
    assert set(inline_script_hashes(html)) == expected
