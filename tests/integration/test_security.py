"""The security review's findings (issue 40), each against the real app: two app processes (`chainlit run app.py`,
login on) on one database and one login secret, the in-process StubEngine (tests/stub_engine.py) as their engine
(it records what the model was asked). Another client address is a request from 127.0.0.1 with X-Forwarded-For, as
a proxy on this machine sends it (uvicorn trusts it from there): what a remote browser behind the proxy is.

- a body over its limit is refused (413) before it is read: the API, the key page, the workshop, the login,
  Chainlit's own routes; nothing of it reaches the engine or a quota;
- logins are throttled per name and per client address, shared by both processes, and never for long;
- a logout ends the session on the server: the kept cookie is refused by both processes, the chat's socket too;
- the security headers on every page; behind HTTPS the cookie is Secure;
- /metrics and the detail of /healthz are for this machine (or the monitoring token); /livez answers everyone;
- a refused API request or chat message counts against no quota; a message that begins with "/" is text in the API;
- Retry-After waits for a dead process's place, not for a live one's;
- a client gone mid-request is one line in the log;
- feedback only on one's own replies; the workshop's try within the editor's quota and the input limit; the first
  page's status for logged-in users only.
The same from a browser, with a page of another origin: tests/browser/test_cross_origin.py."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import httpx
import pytest
import socketio

from backend.accounts.passwords import hash_password
from backend.accounts.users import write_users_file
from backend.config import ROOT
from tests.app_process import RunningApp, start_app
from tests.chat_api import ChatSocket, login
from tests.sqlite_file import opened
from tests.stub_engine import StubEngine
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration]

PASSWORD = "security-password"
ROLES = {"alice": "user", "bob": "user", "carol": "user", "dave": "user", "ed": "editor", "fay": "user", "gus": "user"}
MAX_WAIT_S = 2  # auth.throttle.max_wait_s here
PER_NAME, PER_ADDRESS = 3, 6
MAX_INPUT = 1000  # chat.max_input_chars here
TOKEN = "monitoring-" + uuid.uuid4().hex


@dataclass
class Site:
    apps: list[RunningApp]
    engine: StubEngine
    database: Path
    users: Path

    @property
    def app(self) -> RunningApp:
        return self.apps[0]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("security")
    users = root / "users.yaml"
    write_users_file(users, {name: hash_password(PASSWORD) for name in ROLES}, ROLES)
    database = root / "chat.db"
    settings = {
        "auth__enabled": "true",
        "auth__users_file": str(users),
        "auth__throttle__per_name": str(PER_NAME),
        "auth__throttle__per_address": str(PER_ADDRESS),
        "auth__throttle__max_wait_s": str(MAX_WAIT_S),
        "storage__database_url": f"sqlite+aiosqlite:///{database}",
        "chat__max_input_chars": str(MAX_INPUT),
        "web__monitoring_token": TOKEN,
        "api__overrides__carol__requests_per_minute": "2",
        "api__overrides__dave__concurrent": "1",
        "api__overrides__ed__requests_per_minute": "1",
        "CHAINLIT_AUTH_SECRET": "a-login-secret-shared-by-both-processes-" + uuid.uuid4().hex,
    }
    with StubEngine() as engine:
        apps = [start_app(root / f"data-{n}", **engine.app_overrides(), **settings) for n in (1, 2)]
        try:
            for app in apps:
                app.wait_ready()
            yield Site(apps, engine, database, users)
        finally:
            for app in apps:
                app.kill()


@pytest.fixture
async def alice(site: Site) -> AsyncIterator[httpx.AsyncClient]:
    http = await login(site.app.url, "alice", PASSWORD)
    yield http
    await http.aclose()


async def make_key(url: str, user: str) -> str:
    http = await login(url, user, PASSWORD)
    try:
        made = await http.post("/api-keys/api/keys", json={"name": f"{user}'s tool"})
        assert made.status_code == 201, made.text
        return str(made.json()["key"])
    finally:
        await http.aclose()


def usage(site: Site, user: str) -> list[tuple[str, int]]:
    with opened(site.database) as db:
        rows = db.execute('SELECT "route", "requests" FROM usage_daily WHERE "user_name" = ?', (user,)).fetchall()
    return sorted(rows)


async def raw(url: str, head: str, body: bytes = b"") -> tuple[int, str]:
    """Send `head` (and `body`) on a socket of its own and read the whole answer: (status, body)."""
    where = urlsplit(url)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    try:
        writer.write(head.encode() + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
        await writer.wait_closed()
    status_line, _, rest = answer.decode(errors="replace").partition("\r\n")
    return int(status_line.split()[1]), rest.partition("\r\n\r\n")[2]


def request_head(method: str, path: str, size: int, **headers: str) -> str:
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: 127.0.0.1",
        f"Content-Length: {size}",
        "Content-Type: application/json",
        *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items()),
    ]
    return "\r\n".join(lines) + "\r\n\r\n"


# ----- 3. request sizes --------------------------------------------------------------------------------------------
async def test_a_body_over_its_limit_is_refused_before_it_is_read(site: Site, alice: httpx.AsyncClient) -> None:
    key = await make_key(site.app.url, "bob")
    asked, before = len(site.engine.requests), usage(site, "bob")
    cookie = "; ".join(f"{k}={v}" for k, v in alice.cookies.items())
    ask = {"Expect": "100-continue"}  # as curl sends a large body: it waits for the go-ahead, and gets the 413
    refusals = [  # (path, its limit's setting, the announced size, headers): the bytes are never sent
        ("/v1/chat/completions", "web.max_api_body_kb", 100 * 1024 * 1024, {"Authorization": f"Bearer {key}"}),
        ("/v1/chat/completions", "web.max_api_body_kb", 20 * 1024 * 1024, {"Authorization": f"Bearer {key}"} | ask),
        ("/api-keys/api/keys", "web.max_body_kb", 300 * 1024, {"Cookie": cookie} | ask),
        ("/workshop/api/check", "web.max_body_kb", 300 * 1024, {"Cookie": cookie} | ask),
        ("/login", "web.max_body_kb", 300 * 1024, ask),
        ("/project/threads", "web.max_body_kb", 300 * 1024, {"Cookie": cookie} | ask),
    ]
    for path, setting, size, headers in refusals:
        started = time.monotonic()
        status, body = await raw(site.app.url, request_head("POST", path, size, **headers))
        assert status == 413, (path, status, body)
        assert json.loads(body)["error"]["code"] == "web.too_large" and setting in body, body
        assert time.monotonic() - started < 5, "answered at once, without waiting for the body"

    # no Content-Length: refused as the bytes arrive, once they pass the limit (the rest is never sent)
    head = request_head("POST", "/project/threads", 0, Cookie=cookie).replace(
        "Content-Length: 0", "Transfer-Encoding: chunked"
    )
    chunk = b"4000\r\n" + b"x" * 0x4000 + b"\r\n"
    status, body = await raw(site.app.url, head, chunk * (256 // 16 + 1) + b"0\r\n\r\n")
    assert status == 413 and json.loads(body)["error"]["code"] == "web.too_large"
    # a tool whose client reads the answer once it has sent everything (httpx, the OpenAI SDK): a clean 413 too
    async with httpx.AsyncClient(base_url=site.app.url, trust_env=False, timeout=60) as tool:
        big = {"model": "auto", "messages": [{"role": "user", "content": "x" * 3_000_000}]}
        answer = await tool.post("/v1/chat/completions", json=big, headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "web.too_large"
    assert answer.json()["error"]["type"] == "invalid_request_error"
    zh = await alice.post("/api-keys/api/keys", content=b"{" * 300_000, headers={"Accept-Language": "zh-CN"})
    assert zh.status_code == 413 and "这里最多接受 256 KB" in zh.json()["error"]["message"]
    assert len(site.engine.requests) == asked and usage(site, "bob") == before, "nothing reached the engine or quotas"


# ----- 4. logins ---------------------------------------------------------------------------------------------------
async def attempt(app: RunningApp, name: str, password: str, address: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=app.url, trust_env=False, timeout=30) as http:
        return await http.post(
            "/login", data={"username": name, "password": password}, headers={"X-Forwarded-For": address}
        )


async def test_failed_logins_are_throttled_per_name_on_every_process_and_never_for_long(site: Site) -> None:
    first, second = site.apps
    address = "198.51.100.1"
    for _ in range(PER_NAME):
        assert (await attempt(first, "fay", "wrong", address)).status_code == 401
    started = time.monotonic()
    waits = []
    while time.monotonic() - started < 4 * MAX_WAIT_S:  # wrong passwords as fast as they go, on the other process
        throttled = await attempt(second, "fay", "wrong", address)
        if throttled.status_code == 429:
            waits.append(int(throttled.headers["Retry-After"]))
            assert throttled.json()["error"]["code"] == "login.throttled"
    assert waits and max(waits) <= MAX_WAIT_S, waits
    right = await attempt(first, "fay", PASSWORD, "198.51.100.2")
    assert right.status_code == 429, "the right password waits too: it is not even checked"
    assert "Retry-After" in right.headers and int(right.headers["Retry-After"]) <= MAX_WAIT_S
    await asyncio.sleep(int(right.headers["Retry-After"]))
    assert (await attempt(first, "fay", PASSWORD, "198.51.100.2")).status_code == 200, "then the owner gets in"
    again = await attempt(first, "fay", "wrong", "198.51.100.3")  # the name's count starts again after a success
    assert again.status_code == 401


async def test_failed_logins_are_throttled_per_address_over_all_names(site: Site) -> None:
    address = "198.51.100.7"
    for n in range(PER_ADDRESS):
        assert (await attempt(site.apps[n % 2], f"nobody{n}", "wrong", address)).status_code == 401
    sprayed = await attempt(site.app, "alice", PASSWORD, address)
    assert sprayed.status_code == 429, "an address that tried many names waits, whatever name it tries"
    elsewhere = await attempt(site.app, "alice", PASSWORD, "198.51.100.8")
    assert elsewhere.status_code == 200, "alice from her own address is not locked out by it"


# ----- 5. logout, cookies, headers ---------------------------------------------------------------------------------
async def test_a_logout_ends_the_session_on_every_process(site: Site) -> None:
    http = await login(site.app.url, "bob", PASSWORD)
    token = http.cookies["access_token"]
    assert (await http.get("/user")).status_code == 200
    assert (await http.post("/logout")).status_code == 200
    await http.aclose()
    for app in site.apps:  # a copy of the cookie, kept after the logout
        async with httpx.AsyncClient(base_url=app.url, trust_env=False, cookies={"access_token": token}) as kept:
            assert (await kept.get("/user")).status_code == 401, app.url
            assert "error" in (await kept.get("/api-keys/api/me")).json()
            assert (
                await kept.post("/project/threads", json={"pagination": {"first": 5}, "filter": {}})
            ).status_code == 401
        session = aiohttp.ClientSession()  # its own, closed here: a refused client does not close the one it makes
        sio = socketio.AsyncClient(reconnection=False, http_session=session)
        with pytest.raises(socketio.exceptions.ConnectionError):
            await sio.connect(
                app.url,
                socketio_path="/ws/socket.io",
                transports=["websocket"],
                headers={"Cookie": f"access_token={token}"},
                auth={"sessionId": str(uuid.uuid4()), "clientType": "webapp", "userEnv": "{}"},
            )
        await sio.disconnect()
        await session.close()
    again = await login(site.apps[1].url, "bob", PASSWORD)  # a new login is a new session
    assert (await again.get("/user")).status_code == 200
    await again.aclose()


async def test_a_removed_users_session_ends_with_them(site: Site) -> None:
    """Before, removing a user stopped their next login only: their cookie kept the chat and their threads open."""
    gus = await login(site.app.url, "gus", PASSWORD)
    assert (await gus.get("/user")).status_code == 200
    kept = {name: hash_password(PASSWORD) for name in ROLES if name != "gus"}
    write_users_file(site.users, kept, {name: role for name, role in ROLES.items() if name != "gus"})
    for app in site.apps:
        async with httpx.AsyncClient(base_url=app.url, trust_env=False, cookies=dict(gus.cookies)) as http:
            assert (await http.get("/user")).status_code == 401, app.url
    await gus.aclose()


async def test_every_page_carries_the_security_headers(site: Site, alice: httpx.AsyncClient) -> None:
    for path in ("/", "/login", "/thread/x", "/api-keys", "/workshop", "/v1/models", "/healthz", "/public/ernie.js"):
        headers = (await alice.get(path)).headers
        assert headers["x-frame-options"] == "DENY", path
        assert "frame-ancestors 'none'" in headers["content-security-policy"], path
        assert headers["x-content-type-options"] == "nosniff", path
    for own in ("/api-keys", "/workshop"):
        policy = (await alice.get(own)).headers["content-security-policy"]
        assert "script-src 'self';" in policy and "unsafe" not in policy.split("style-src")[0], policy


async def test_behind_https_the_login_cookie_is_secure(site: Site) -> None:
    async with httpx.AsyncClient(base_url=site.app.url, trust_env=False) as http:
        answer = await http.post(
            "/login",
            data={"username": "carol", "password": PASSWORD},
            headers={"X-Forwarded-Proto": "https", "X-Forwarded-For": "198.51.100.20"},
        )
        plain = await http.post("/login", data={"username": "carol", "password": PASSWORD})
    assert answer.status_code == 200
    assert "; Secure" in answer.headers["set-cookie"] and "max-age" in answer.headers["strict-transport-security"]
    assert "Secure" not in plain.headers["set-cookie"], "plain HTTP on this machine: a Secure cookie would be lost"


# ----- monitoring ---------------------------------------------------------------------------------------------------
async def test_metrics_and_health_detail_are_for_this_machine_or_the_token(site: Site) -> None:
    remote = {"X-Forwarded-For": "203.0.113.9"}
    async with httpx.AsyncClient(base_url=site.app.url, trust_env=False) as http:
        for path in ("/metrics", "/metrics/engine"):  # the StubEngine has no metrics of its own: 503 there
            refused = await http.get(path, headers=remote)
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "web.monitoring", path
            token = await http.get(path, headers=remote | {"Authorization": f"Bearer {TOKEN}"})
            local = await http.get(path)  # this machine
            for allowed in (token, local):
                assert allowed.status_code == (200 if path == "/metrics" else 503), (path, allowed.text)
        assert (await http.get("/healthz", headers=remote)).json() == {"status": "ok"}
        assert (await http.get("/healthz")).json()["engine"]["state"] == "ready"
        assert (await http.get("/livez", headers=remote)).json() == {"status": "alive"}


async def test_the_first_pages_status_is_for_logged_in_users(site: Site, alice: httpx.AsyncClient) -> None:
    async with httpx.AsyncClient(base_url=site.app.url, trust_env=False) as anonymous:
        assert (await anonymous.get("/ernie/status")).status_code == 401
    assert "serving" in (await alice.get("/ernie/status")).json()


# ----- 5. what quotas count -------------------------------------------------------------------------------------------
async def test_refused_requests_and_messages_count_against_no_quota(site: Site) -> None:
    """carol may send 2 requests a minute: refusals before the engine is asked use none of them."""
    key = await make_key(site.app.url, "carol")
    api = httpx.AsyncClient(base_url=site.app.url + "/v1", headers={"Authorization": f"Bearer {key}"}, timeout=60)
    model = (await api.get("/models")).json()["data"][0]["id"]
    hello = [{"role": "user", "content": "Hello"}]
    refused = [
        {"model": "no-such-model", "messages": hello},
        {"model": f"{model}:no-such-template", "messages": hello},
        {"model": model, "template": "no-such-template", "messages": hello},
        {"model": model, "messages": [{"role": "user", "content": "x" * (MAX_INPUT + 1)}]},
        {"model": model, "messages": [{"role": "assistant", "content": "Hi"}]},
    ]
    for body in refused:
        answer = await api.post("/chat/completions", json=body)
        assert answer.status_code in (400, 404), answer.text
    carol = await login(site.app.url, "carol", PASSWORD)
    chat = ChatSocket(site.app.url, carol)
    await chat.connect()
    for text in ("/no-such-template hi", "y" * (MAX_INPUT + 1)):
        await chat.ask(text)
    assert len(chat.notices()) >= 2, "the chat said why"
    await chat.close()
    await carol.aclose()
    assert usage(site, "carol") == []
    for _ in range(2):
        answer = await api.post("/chat/completions", json={"model": model, "messages": hello})
        assert answer.status_code == 200, answer.text
    assert (await api.post("/chat/completions", json={"model": model, "messages": hello})).status_code == 429
    assert usage(site, "carol") == [("api", 2)]
    await api.aclose()


async def test_a_message_that_begins_with_a_slash_is_text_in_the_api(site: Site) -> None:
    key = await make_key(site.app.url, "alice")
    text = "/word counts the words of a file: show me how"  # before: refused, "there is no template called word"
    async with httpx.AsyncClient(base_url=site.app.url + "/v1", headers={"Authorization": f"Bearer {key}"}) as api:
        model = (await api.get("/models")).json()["data"][0]["id"]
        answer = await api.post(
            "/chat/completions", json={"model": model, "messages": [{"role": "user", "content": text}]}, timeout=60
        )
    assert answer.status_code == 200, answer.text
    assert any(text in content for role, content in site.engine.conversations()[-1] if role == "user")


async def test_retry_after_waits_for_a_dead_processs_place_and_not_for_a_live_one(site: Site) -> None:
    """dave has one place. A process that died left his place taken (its row, last refreshed 40 s ago): Retry-After
    says when it frees itself (api.lease_s, 60 s, after that), not 5 s over and over. A place a live process holds (a
    reply being written) may end any moment: 5 s."""
    key = await make_key(site.app.url, "dave")
    with opened(site.database) as db:
        db.execute(
            'INSERT INTO quota_leases ("id", "user_name", "started") VALUES (?, ?, ?)',
            ("dead-process-lease", "dave", time.time() - 40),
        )
    api = httpx.AsyncClient(base_url=site.app.url + "/v1", headers={"Authorization": f"Bearer {key}"}, timeout=60)
    model = (await api.get("/models")).json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "stream": True}
    busy = await api.post("/chat/completions", json=body)
    assert busy.status_code == 429 and 15 <= int(busy.headers["Retry-After"]) <= 20, busy.headers
    with opened(site.database) as db:
        db.execute("DELETE FROM quota_leases WHERE \"id\" = 'dead-process-lease'")
    site.engine.held.clear()
    site.engine.release.clear()
    site.engine.hold_path = "/v1/chat/completions"
    try:
        async with api.stream("POST", "/chat/completions", json=body) as writing:
            await asyncio.to_thread(site.engine.held.wait, 30)
            second = await api.post("/chat/completions", json=body)
            assert second.status_code == 429 and second.headers["Retry-After"] == "5"
            site.engine.release.set()
            await writing.aread()
    finally:
        site.engine.hold_path = None
        site.engine.release.set()
    await api.aclose()


# ----- a client gone mid-request ----------------------------------------------------------------------------------
async def test_a_client_gone_mid_request_is_one_line_in_the_log(site: Site) -> None:
    key = await make_key(site.app.url, "alice")
    before = len(site.app.log_text())
    where = urlsplit(site.app.url)
    _, writer = await asyncio.open_connection(where.hostname, where.port)
    writer.write(request_head("POST", "/v1/chat/completions", 5000, Authorization=f"Bearer {key}").encode() + b"{")
    await writer.drain()
    await asyncio.sleep(0.5)
    writer.close()
    await writer.wait_closed()
    await asyncio.sleep(1.5)
    log = site.app.log_text()[before:]
    assert "went away" in log and "Traceback" not in log and "Exception in ASGI application" not in log, log
    assert len([line for line in log.splitlines() if "went away" in line]) == 1


# ----- the same classes of hole elsewhere ---------------------------------------------------------------------------
async def test_feedback_only_on_ones_own_replies(site: Site) -> None:
    users = {name: await login(site.app.url, name, PASSWORD) for name in ("alice", "bob")}
    chats = {name: ChatSocket(site.app.url, http) for name, http in users.items()}
    try:
        await rate_replies(site, users, chats)
    finally:  # a failed check leaves no socket open for a later test to trip over
        for name in chats:
            await chats[name].close()
            await users[name].aclose()


async def rate_replies(site: Site, users: dict[str, httpx.AsyncClient], chats: dict[str, ChatSocket]) -> None:
    replies = {}
    for name, chat in chats.items():
        await chat.connect()
        await chat.ask(f"{name}'s question")
        assert chat.last_reply is not None
        replies[name] = (chat.last_reply["id"], chat.thread_id, chat.session_id)
    alice_step, alice_thread, alice_session = replies["alice"]
    bob_step, _, bob_session = replies["bob"]

    def saved() -> bool:  # Chainlit saves a reply's step in a task of its own
        with opened(site.database) as db:
            found = db.execute('SELECT COUNT(*) FROM steps WHERE "id" IN (?, ?)', (alice_step, bob_step)).fetchone()
        return bool(found[0] == 2)

    try:
        await asyncio.to_thread(wait_until, saved, "both replies saved", 60)
    except AssertionError as err:
        raise AssertionError(f"{err}; what the apps logged:\n{log_tails(site)}") from None

    def rating(step: str, session: str, **more: str) -> dict[str, object]:
        return {"feedback": {"forId": step, "value": 1, **more}, "sessionId": session}

    mine = await users["alice"].put("/feedback", json=rating(alice_step, alice_session, threadId=alice_thread))
    assert mine.status_code == 200, mine.text
    feedback_id = mine.json()["feedbackId"]
    attempts = [
        users["bob"].put("/feedback", json=rating(alice_step, bob_session)),  # a rating on alice's reply
        users["bob"].put("/feedback", json=rating(bob_step, bob_session, id=feedback_id)),  # alice's rating taken
        users["bob"].put("/feedback", json=rating(bob_step, alice_session)),  # in alice's chat session
        users["bob"].request("DELETE", "/feedback", json={"feedbackId": feedback_id}),  # alice's rating deleted
    ]
    for answer in await asyncio.gather(*attempts):
        assert answer.status_code == 404, answer.text
    with opened(site.database) as db:
        rows = db.execute('SELECT "forId", "value" FROM feedbacks WHERE "id" = ?', (feedback_id,)).fetchall()
    assert rows == [(alice_step, 1)], "alice's rating is hers, as she gave it"
    assert (await users["bob"].put("/feedback", json=rating(bob_step, bob_session))).status_code == 200


def log_tails(site: Site) -> str:
    return "\n".join(f"--- {app.url}\n{app.log_text()[-3000:]}" for app in site.apps)


async def test_the_workshops_try_is_a_reply_within_the_editors_quota_and_input_limit(site: Site) -> None:
    """ed may send one request a minute: a try is a reply of his; a message over chat.max_input_chars is refused in the
    preview and the try as in the chat (and, refused before the engine is asked, counts nothing)."""
    ed = await login(site.app.url, "ed", PASSWORD)
    draft = {"stem": "default", "yaml": (ROOT / "prompts" / "default.yaml").read_text()}
    long = await ed.post("/workshop/api/preview", json=draft | {"message": "z" * (MAX_INPUT + 1)})
    assert long.json()["request_error"]["code"] == "input.too_large"

    async def tried(message: str = "Hello") -> list[str]:
        answer = await ed.post("/workshop/api/try", json=draft | {"message": message}, timeout=60)
        events = [json.loads(line) for line in answer.text.splitlines() if line]
        return [event["error"]["code"] if "error" in event else next(iter(event)) for event in events]

    assert await tried("z" * (MAX_INPUT + 1)) == ["input.too_large"]
    assert (await tried())[-1] == "done"
    assert await tried() == ["quota.rate"]
    assert usage(site, "ed") == [("chat", 1)]
    await ed.aclose()
