"""The real app (`chainlit run app.py`) in headless Chromium: streaming, stop button, languages, shutdown.

The app starts its own engine; with the hub out of reach it serves the offline demo model."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from backend.config import ROOT
from backend.supervisor import free_port

pytestmark = [pytest.mark.browser, pytest.mark.integration]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REPLY = '.step[data-step-type="assistant_message"] .message-content'


def get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def group_alive(pgid: int) -> list[int]:
    """PIDs still alive in process group `pgid` (zombies excluded)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


class App:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    def health(self) -> dict:
        return get_json(self.url + "/healthz")[1]


@pytest.fixture(scope="module")
def app(demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: apt-get install -y chromium (make test-deps does it)")
    data = tmp_path_factory.mktemp("app-data")
    port = free_port()
    env = {
        **os.environ,
        "ERNIE_PATHS__DATA_DIR": str(data),
        "ERNIE_SERVER__PORT": "0",
        "ERNIE_ENGINE__FLAGS__CPU_KVCACHE_SPACE_GIB": "1",
        "HF_ENDPOINT": "http://127.0.0.1:9",  # the hub is out of reach: the app falls back to the demo model
        "HF_HOME": str(data / "hf"),
    }
    log = data / "app.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chainlit", "run", "app.py", "--headless", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    app = App(proc, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if app.health()["status"] == "ok":
                    break
            except OSError:
                pass
            time.sleep(1)
        else:
            pytest.fail("the app's engine did not become ready:\n" + log.read_text()[-3000:])
        yield app
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest_asyncio.fixture(scope="module")
async def browser() -> AsyncIterator[object]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        await browser.close()


async def open_chat(browser, app: App, locale: str):  # type: ignore[no-untyped-def]
    page = await (await browser.new_context(locale=locale)).new_page()
    await page.goto(app.url)
    await page.wait_for_selector("#chat-input", timeout=60_000)
    # The demo-model notice is the last thing on_chat_start sends: the session is set up.
    await page.wait_for_selector(f"{REPLY} >> text=SmolLM2", timeout=60_000)
    return page


async def send(page, text: str) -> None:  # type: ignore[no-untyped-def]
    await page.click("#chat-input")
    await page.keyboard.type(text)
    await page.keyboard.press("Enter")


async def test_reply_streams_token_by_token(app: App, browser) -> None:  # type: ignore[no-untyped-def]
    page = await open_chat(browser, app, "en-US")
    before = await page.locator(REPLY).count()
    await send(page, "What is the capital of France?")
    reply = page.locator(REPLY).nth(before)
    await reply.wait_for(timeout=60_000)
    lengths: list[int] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = await reply.inner_text()
        if not lengths or len(text) != lengths[-1]:
            lengths.append(len(text))
        if "Template:" in text:
            break
        await asyncio.sleep(0.05)
    final = await reply.inner_text()
    assert "Template: default" in final, final
    assert "Paris" in final or len(final) > 40, final
    assert len(lengths) >= 3, f"the reply should grow while streaming, saw lengths {lengths}"
    # the conversation is kept: a follow-up question answers in the same thread
    await send(page, "And of Germany?")
    await page.locator(REPLY).nth(before + 1).wait_for(timeout=60_000)
    await page.wait_for_selector(f"{REPLY} >> nth={before + 1} >> text=Template:", timeout=120_000)
    await page.screenshot(path=str(app.log.parent / "chat.png"), full_page=True)


async def test_stop_button_ends_the_reply_and_frees_the_engine(app: App, browser) -> None:  # type: ignore[no-untyped-def]
    page = await open_chat(browser, app, "en-US")
    before = await page.locator(REPLY).count()
    await send(page, "Write a very long story about a robot who learns to paint.")
    reply = page.locator(REPLY).nth(before)
    await reply.wait_for(timeout=60_000)
    await page.wait_for_function(
        "([sel, n]) => (document.querySelectorAll(sel)[n]?.innerText || '').length > 20",
        arg=[REPLY, before],
        timeout=60_000,
    )
    await page.click("#stop-button")
    await page.wait_for_selector(f"{REPLY} >> nth={before} >> text=Stopped.", timeout=10_000)
    text = await reply.inner_text()
    assert "Template: writing" in text and len(text) > 20
    # the engine is no longer working on that reply
    engine = app.health()["engine"]["base_url"]
    deadline = time.monotonic() + 5
    running = None
    while time.monotonic() < deadline:
        metrics = await asyncio.to_thread(
            lambda: urllib.request.urlopen(engine + "/metrics", timeout=5).read().decode()
        )
        running = sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("vllm:num_requests_running{")
        )
        if running == 0:
            break
        await asyncio.sleep(0.2)
    assert running == 0
    assert await page.is_visible("#chat-input")


async def test_chinese_browser_gets_chinese_messages(app: App, browser) -> None:  # type: ignore[no-untyped-def]
    page = await (await browser.new_context(locale="zh-CN")).new_page()
    await page.goto(app.url)
    await page.wait_for_selector(f"{REPLY} >> text=离线演示模型", timeout=60_000)
    await send(page, "   ")  # whitespace only: a friendly message, nothing sent to the engine
    assert await page.locator("#chat-input").is_visible()
    await send(page, "你好")
    await page.wait_for_selector(f"{REPLY} >> text=模板：default", timeout=120_000)


def test_app_shutdown_leaves_no_engine_behind(app: App) -> None:
    engine_pid = app.health()["engine"]["pid"]
    assert engine_pid and group_alive(engine_pid)
    app.proc.send_signal(signal.SIGINT)
    app.proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while group_alive(engine_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_alive(engine_pid), "the engine outlived the app"
