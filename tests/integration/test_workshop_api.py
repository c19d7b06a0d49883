"""The template workshop's API on the real app (`chainlit run app.py`, login on, its own copy of the prompts folder):
an editor creates a template (a draft with problems is refused with check-prompts' messages), the chat uses it on the
next message without a restart, a second editor with a stale version gets a conflict, a restore brings the first
version back, a draft is tried through the app's client; users without the editor role and anonymous requests get
403. The engine is the in-process StubEngine (tests/stub_engine.py), which records what the model was asked: the
evidence that the chat used the saved text."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from backend.accounts.passwords import hash_password
from backend.accounts.users import write_users_file
from backend.config import ROOT
from backend.prompts.schema import display_path, form_fields
from tests.app_process import RunningApp, start_app
from tests.chat_api import ChatSocket, login
from tests.stub_engine import StubEngine

pytestmark = [pytest.mark.integration]

PASSWORD = "workshop-password"
ROLES = {"ed": "editor", "ada": "admin", "uma": "user"}
API = "/workshop/api"


@dataclass
class Site:
    app: RunningApp
    engine: StubEngine
    prompts: Path


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("workshop-api")
    prompts = Path(shutil.copytree(ROOT / "prompts", root / "prompts"))
    users = root / "users.yaml"
    write_users_file(users, {name: hash_password(PASSWORD) for name in ROLES}, ROLES)
    with StubEngine() as engine:
        app = start_app(
            root / "data",
            auth__enabled="true",
            auth__users_file=str(users),
            paths__prompts_dir=str(prompts),
            **engine.app_overrides(),
        )
        try:
            app.wait_ready()
            yield Site(app, engine, prompts)
        finally:
            app.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def users(site: Site) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    clients = {name: await login(site.app.url, name, PASSWORD) for name in ROLES}
    yield clients
    for http in clients.values():
        await http.aclose()


def poem(stem: str, line: str, keyword: str) -> str:
    return f"name: {stem}\npriority: 50\nkeywords: [{keyword}]\nuser: |\n  {line}\n  {{input}}\n"


async def asked(site: Site, http: httpx.AsyncClient, text: str) -> str:
    """The user message the model was sent for `text` typed in a new chat of the user of `http`."""
    chat = ChatSocket(site.app.url, http)
    await chat.connect()
    before = len(site.engine.requests)
    await chat.ask(text)
    await chat.close()
    assert len(site.engine.requests) == before + 1
    return str(site.engine.requests[-1]["messages"][-1]["content"])


async def test_non_editors_get_403_from_every_route(site: Site, users: dict[str, httpx.AsyncClient]) -> None:
    stem = f"nope-{uuid.uuid4().hex[:8]}"
    text = poem(stem, "Nope:", "nopeword")
    calls = [
        ("GET", "/templates", None),
        ("GET", "/templates/writing", None),
        ("POST", "/check", {"stem": stem, "yaml": text}),
        ("POST", "/preview", {"stem": stem, "yaml": text, "message": "nopeword"}),
        ("POST", "/try", {"stem": stem, "yaml": text, "message": "nopeword"}),
        ("POST", "/templates", {"stem": stem, "yaml": text}),
        ("PUT", "/templates/writing", {"yaml": text, "base": "x"}),
        ("DELETE", "/templates/writing?base=x", None),
        ("GET", "/templates/writing/versions", None),
        ("POST", "/templates/writing/compare", {"yaml": text}),
        ("POST", "/templates/writing/restore", {"version": 1, "base": "x"}),
    ]
    async with httpx.AsyncClient(base_url=site.app.url, trust_env=False) as anonymous:
        refusals = (("anonymous", anonymous, "workshop.login_needed"), ("uma", users["uma"], "workshop.not_editor"))
        for who, http, code in refusals:
            for method, path, body in calls:
                response = await http.request(method, API + path, json=body)
                assert response.status_code == 403, (who, method, path, response.text)
                assert response.json()["error"]["code"] == code
        refused = await users["uma"].get(API + "/templates", headers={"Accept-Language": "zh-CN"})
        assert (
            refused.json()["error"]["message"]
            == "用户“uma”的角色是 user；只有编辑者（editor）和管理员（admin）可以修改模板。"
        )
        me = (await anonymous.get(API + "/me")).json()
        assert me["may_edit"] is False and me["login"] is True
        fields = (await anonymous.get(API + "/fields")).json()["fields"]  # the form's schema: no secret
        assert fields == form_fields() and fields[-1]["name"] == "passages"
        page = await anonymous.get("/workshop")  # the page itself is open: it says why nothing can be changed
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert not (site.prompts / f"{stem}.yaml").exists()
    assert (await users["ada"].get(API + "/templates")).status_code == 200, "an admin may edit"
    # an editor's browser on another site's page: its request carries the editor's cookie, and is refused (by the
    # guard every request passes, backend.web.guard, in the workshop's error shape)
    foreign = await users["ed"].post(API + "/check", json={"stem": stem, "yaml": text},
                                     headers={"Origin": "http://evil.example"})  # fmt: skip
    assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "web.foreign_origin"
    assert foreign.json()["error"]["hint"], "the workshop's page shows the message and the hint"


async def test_create_use_conflict_restore(site: Site, users: dict[str, httpx.AsyncClient]) -> None:
    ed, ada = users["ed"], users["ada"]
    stem = f"poem-{uuid.uuid4().hex[:8]}"
    keyword = f"zeb{uuid.uuid4().hex[:6]}"
    path = display_path(site.prompts / f"{stem}.yaml")

    # a draft with a typo: check-prompts' message (file, line, field, what to do); creating it is refused
    typo = poem(stem, "Poem one:", keyword) + "temprature: 0.5\n"
    checked = (await ed.post(API + "/check", json={"stem": stem, "yaml": typo})).json()
    texts = [p["text"] for p in checked["problems"]]
    assert texts == [
        f'{path}, line 7, field "temprature": is not a known field; did you mean "temperature"? known fields: '
        "name, description, priority, keywords, patterns, system, user, variables, temperature, top_p, max_tokens, "
        "stop, route_on_demo, documents, passages"
    ]
    refused = await ed.post(API + "/templates", json={"stem": stem, "yaml": typo})
    assert refused.status_code == 422 and [p["text"] for p in refused.json()["problems"]] == texts
    assert refused.json()["error"]["code"] == "workshop.problems_new", "never saved: no version of it serves"
    assert not (site.prompts / f"{stem}.yaml").exists()

    # created from form fields; the chat routes the next message to it, no restart
    fields = {"name": stem, "priority": 50, "keywords": [keyword], "user": "Poem one:\n{input}"}
    created = await ed.post(API + "/templates", json={"stem": stem, "fields": fields, "note": "first"})
    assert created.status_code == 201, created.text
    first = created.json()
    assert (first["saved"]["number"], first["saved"]["who"], first["saved"]["note"]) == (1, "ed", "first")
    listed = {t["stem"]: t for t in (await ed.get(API + "/templates")).json()["templates"]}
    assert (listed[stem]["keywords"], listed[stem]["priority"], listed[stem]["version"]) == (
        [keyword],
        50,
        first["version"],
    )
    assert await asked(site, ed, f"{keyword} the cat") == f"Poem one:\n{keyword} the cat"

    # the second version, then a second editor saving over the first one: a conflict naming who saved
    two = {"yaml": poem(stem, "Poem two:", keyword), "base": first["version"], "note": "shorter"}
    second = await ed.put(f"{API}/templates/{stem}", json=two)
    assert second.status_code == 200, second.text
    assert await asked(site, ada, f"{keyword} the dog") == f"Poem two:\n{keyword} the dog"
    third = {"yaml": poem(stem, "Poem three:", keyword), "base": first["version"]}
    stale = await ada.put(f"{API}/templates/{stem}", json=third, headers={"Accept-Language": "zh-CN"})
    assert stale.status_code == 409
    assert stale.json()["error"]["code"] == "workshop.conflict"
    assert stale.json()["error"]["message"].startswith(f"在您打开“{stem}”之后，别人修改了它（ed，")
    assert "Poem two:" in (site.prompts / f"{stem}.yaml").read_text()
    merge = (await ada.post(f"{API}/templates/{stem}/compare", json={"yaml": third["yaml"]})).json()["diff"]
    assert "-  Poem two:\n" in merge and "+  Poem three:\n" in merge  # what to merge by hand

    # a draft with problems never replaces the good version: the chat goes on with it
    broken = await ed.put(f"{API}/templates/{stem}", json={"yaml": "name: [", "base": second.json()["version"]})
    assert broken.status_code == 422
    assert await asked(site, ed, f"{keyword} the owl") == f"Poem two:\n{keyword} the owl"

    # history, diff, restore
    versions = (await ed.get(f"{API}/templates/{stem}/versions")).json()
    assert [(v["number"], v["who"], v["note"]) for v in versions["versions"]] == [
        (2, "ed", "shorter"),
        (1, "ed", "first"),
    ]
    diff = (await ed.get(f"{API}/templates/{stem}/diff", params={"old": 1, "new": 2})).json()["diff"]
    assert "-  Poem one:\n" in diff and "+  Poem two:\n" in diff
    restored = await ada.post(f"{API}/templates/{stem}/restore", json={"version": 1, "base": second.json()["version"]})
    assert restored.status_code == 200, restored.text
    assert (restored.json()["saved"]["number"], restored.json()["saved"]["who"]) == (3, "ada")
    assert await asked(site, ed, f"{keyword} the fox") == f"Poem one:\n{keyword} the fox"

    copy = await ed.post(f"{API}/templates/{stem}/duplicate", json={"stem": f"{stem}-copy"})
    assert copy.status_code == 201 and copy.json()["fields"]["name"] == f"{stem}-copy"
    assert copy.json()["saved"]["note"] == f"copy of {stem}"
    again = await ed.post(f"{API}/templates/{stem}/duplicate", json={"stem": f"{stem}-copy"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "workshop.exists"
    for name, current in ((f"{stem}-copy", copy.json()["version"]), (stem, restored.json()["version"])):
        deleted = await ed.delete(f"{API}/templates/{name}", params={"base": current})
        assert deleted.status_code == 200 and not (site.prompts / f"{name}.yaml").exists()
    kept = await ed.delete(f"{API}/templates/default", params={"base": "x"})
    assert kept.status_code == 400 and kept.json()["error"]["code"] == "workshop.keep_default"


async def test_preview_and_try_a_draft_through_the_app(site: Site, users: dict[str, httpx.AsyncClient]) -> None:
    ed = users["ed"]
    stem = f"try-{uuid.uuid4().hex[:8]}"
    draft = {"stem": stem, "yaml": poem(stem, "Tried:", "写") + "temperature: 1.25\n", "message": "写一首诗"}
    shown = (await ed.post(API + "/preview", json=draft)).json()
    assert shown["routing"]["picked"] == stem and shown["routing"]["outcome"] == "draft"  # priority 50 beats writing
    assert shown["request"]["user"] == "Tried:\n写一首诗" and shown["request"]["template"] == stem
    assert shown["request"]["sampling"]["temperature"] == 1.25
    low = {**draft, "yaml": draft["yaml"].replace("priority: 50", "priority: 1")}
    lost = (await ed.post(API + "/preview", json=low)).json()["routing"]
    assert (lost["picked"], lost["outcome"]) == ("writing", "other_first")

    before = len(site.engine.requests)
    async with ed.stream("POST", API + "/try", json=draft) as response:
        assert response.status_code == 200
        events = [json.loads(line) async for line in response.aiter_lines() if line]
    assert events[0]["request"]["template"] == stem
    assert "".join(e["text"] for e in events if "text" in e) == site.engine.reply
    assert "done" in events[-1]
    assert len(site.engine.requests) == before + 1
    sent = site.engine.requests[-1]
    assert sent["messages"][-1]["content"] == "Tried:\n写一首诗" and sent["temperature"] == 1.25
    assert not (site.prompts / f"{stem}.yaml").exists(), "trying saves nothing"
    log = site.app.log_text()
    assert "Exception in ASGI application" not in log and "Traceback (most recent call last)" not in log
