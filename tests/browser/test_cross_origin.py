"""Another origin's page in the same headless Chromium (another port of 127.0.0.1: the same site, another origin) tries
what the security review did (issue 40, findings 1 and 2):

1. with a user logged in to the app, it reads their conversations: Chainlit's own /project/threads and
   /project/thread/<id> with the user's cookie (fetch with credentials), and the thread through the chat's websocket
   (the cookie goes along; a websocket knows no CORS). Nothing of the secret the user typed may come back.
2. with login off and the API on ("this machine only"), it uses the API from the browser on the app's machine: a
   cross-site text/plain POST (no preflight) that could read its answer, and a no-cors one. Neither may reach the
   engine.
Meanwhile the app's own page chats as before. Each finding at the HTTP level: tests/integration/test_security.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from backend.accounts.passwords import hash_password
from backend.accounts.users import write_users_file
from tests.app_process import REPLY, RunningApp, start_app
from tests.browser.pages import send, sign_in
from tests.deadlines import WAIT_MS
from tests.http_server import ThreadedServer
from tests.isolation import new_markers
from tests.stub_engine import StubEngine

pytestmark = [pytest.mark.browser, pytest.mark.integration]

PASSWORD = "cross-origin-password"

# What another site's page does with the app at APP (its answers go to window.results, "done" when all ended).
EVIL_PAGE = """<!doctype html><html><body><pre id="out"></pre><script>
const APP = "%(app)s", THREAD = new URLSearchParams(location.search).get("thread");
window.results = {};
const note = (key, value) => { window.results[key] = value; document.getElementById("out").textContent =
  JSON.stringify(window.results); };
async function read(key, url, options) {
  try {
    const response = await fetch(url, { credentials: "include", ...options });
    note(key, { status: response.status, text: await response.text() });
  } catch (err) { note(key, { error: String(err) }); }
}
function socket() {  // Chainlit's socket.io, spoken by hand: connect with the thread to resume, collect what comes
  return new Promise((resolve) => {
    const seen = [];
    const ws = new WebSocket(APP.replace("http", "ws") + "/ws/socket.io/?EIO=4&transport=websocket");
    const done = (how) => { note("socket", { how, seen: seen.join("\\n") }); resolve(); };
    ws.onmessage = (event) => {
      const data = String(event.data);
      seen.push(data);
      if (data.startsWith("0{")) ws.send("40" + JSON.stringify({ sessionId: crypto.randomUUID(), clientType: "webapp",
                                                                 userEnv: "{}", threadId: THREAD }));
      else if (data.startsWith("40{")) ws.send('42["connection_successful"]');
      else if (data === "2") ws.send("3");
    };
    ws.onerror = () => done("error");
    ws.onclose = (event) => done("closed " + event.code);
    setTimeout(() => { ws.close(); done("timeout"); }, 8000);
  });
}
async function main() {
  const mode = new URLSearchParams(location.search).get("mode");
  if (mode === "history") {
    await read("threads", APP + "/project/threads", { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ pagination: { first: 20 }, filter: {} }) });
    await read("thread", APP + "/project/thread/" + THREAD, {});
    await socket();
  } else {
    const body = JSON.stringify({ model: "auto", messages: [{ role: "user", content: "from a foreign page" }] });
    const plain = { method: "POST", headers: { "Content-Type": "text/plain" }, body };
    await read("api", APP + "/v1/chat/completions", plain);
    await read("no_cors", APP + "/v1/chat/completions", { method: "POST", mode: "no-cors", body });
  }
  note("done", true);
}
main();
</script></body></html>"""


# The app's own page: its thread's id once the thread with `secret` in it can be read, else null.
OWN_READ = """async (secret) => {
  const post = { method: "POST", headers: { "Content-Type": "application/json" },
                 body: JSON.stringify({ pagination: { first: 20 }, filter: {} }) };
  const listed = await (await fetch("/project/threads", post)).json();
  if (!listed.data || !listed.data.length) return null;
  const id = listed.data[0].id;
  return (await (await fetch("/project/thread/" + id)).text()).includes(secret) ? id : null;
}"""


class EvilSite(ThreadedServer):
    """A page of another origin (this machine, another port) that targets the app at `app_url`."""

    def __init__(self, app_url: str) -> None:
        page = (EVIL_PAGE % {"app": app_url}).encode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

        super().__init__(Handler, "evil-site")


@asynccontextmanager
async def serving(app: RunningApp) -> AsyncIterator[RunningApp]:
    """The app once it is ready, killed when the block ends."""
    try:
        await asyncio.to_thread(app.wait_ready)
        yield app
    finally:
        app.kill()


async def results_of(page: Any) -> dict[str, Any]:
    await page.wait_for_function("() => window.results && window.results.done === true", timeout=WAIT_MS)
    return dict(await page.evaluate("() => window.results"))


@pytest.fixture(scope="module")
def engine() -> Iterator[StubEngine]:
    with StubEngine(reply="A reply that says nothing of the secret.") as fake:
        yield fake


@pytest_asyncio.fixture(scope="module")
async def login_app(engine: StubEngine, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningApp]:
    root = tmp_path_factory.mktemp("cross-origin-login")
    users = root / "users.yaml"
    # an editor: the test also opens the workshop (under its own policy) as she would
    write_users_file(users, {"alice": hash_password(PASSWORD)}, roles={"alice": "editor"})
    async with serving(start_app(root / "data", **engine.app_overrides(), auth__enabled="true",
                                 auth__users_file=str(users))) as app:  # fmt: skip
        yield app


async def test_another_origins_page_cannot_read_a_logged_in_users_conversations(
    browser: Any, login_app: RunningApp
) -> None:
    secret = new_markers(1)[0]
    context = await browser.new_context(locale="en-US")
    page = await context.new_page()
    refused: list[str] = []  # what the pages' content security policy blocked: nothing of the app's own
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    await sign_in(page, login_app.url, "alice", PASSWORD)
    await send(page, f"My bank PIN is {secret}; keep it to yourself.")
    await page.wait_for_selector(REPLY, timeout=WAIT_MS)
    # the app's own page reads the thread list and the thread, with the secret in it (saved in a moment)
    thread = await page.wait_for_function(OWN_READ, arg=secret, timeout=WAIT_MS, polling=500)
    thread = await thread.json_value()

    with EvilSite(login_app.url) as evil:
        foreign = await context.new_page()  # the same browser: the user's cookie goes along where the browser allows
        await foreign.goto(f"{evil.url}/page.html?mode=history&thread={thread}")
        results = await results_of(foreign)
    leaked = {key: value for key, value in results.items() if secret in json.dumps(value)}
    assert not leaked, f"another origin read the secret: {leaked}"
    for key in ("threads", "thread"):
        assert "error" in results[key], results[key]  # refused (403) and unreadable: no CORS answer for it
    assert results["socket"]["how"].startswith(("error", "closed")) and "resume_thread" not in results["socket"]["seen"]

    await send(page, "And one more message")  # the app's own page chats on, its socket untouched
    await page.wait_for_function(f"() => document.querySelectorAll('{REPLY}').length >= 2", timeout=WAIT_MS)
    await page.goto(login_app.url + "/api-keys")  # the app's own pages under their stricter policy
    await page.wait_for_selector("#manage:not([hidden])", timeout=WAIT_MS)
    await page.goto(login_app.url + "/workshop")
    await page.wait_for_selector("body[data-ready=true]", timeout=WAIT_MS)
    assert refused == [], refused
    await context.close()


@pytest_asyncio.fixture(scope="module")
async def local_api_app(engine: StubEngine, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningApp]:
    root: Path = tmp_path_factory.mktemp("cross-origin-api")
    async with serving(start_app(root / "data", **engine.app_overrides(), api__enabled="true")) as app:  # login off
        yield app


async def test_another_origins_page_cannot_use_the_local_api(
    browser: Any, local_api_app: RunningApp, engine: StubEngine
) -> None:
    asked = len(engine.requests)
    context = await browser.new_context(locale="en-US")
    with EvilSite(local_api_app.url) as evil:
        foreign = await context.new_page()
        await foreign.goto(f"{evil.url}/page.html?mode=api")
        results = await results_of(foreign)
    assert "error" in results["api"], f"another origin read the API's answer: {results['api']}"
    assert not [c for c in engine.conversations()[asked:] if "from a foreign page" in json.dumps(c)], (
        "a foreign page's request reached the engine"
    )
    api = await (await context.new_page()).request.post(  # the machine's own tools (no Origin) still use it
        local_api_app.url + "/v1/chat/completions",
        data={"model": "auto", "messages": [{"role": "user", "content": "from a local tool"}]},
    )
    assert api.status == 200, await api.text()
    await context.close()
