"""The stop button (Chainlit's "stop" event) at a moment the browser tests cannot pick: while the turn is still
preparing its request (fitting the conversation into the context window, which asks the engine to count tokens),
before anything streams. The engine is a StubEngine (tests/stub_engine.py) that holds that count until the stop
has landed, so the moment is certain."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from backend.chat.i18n import t
from backend.chat.saved import SYSTEM_AUTHOR
from tests.app_process import start_app
from tests.chat_api import ChatSocket, rendered_finished
from tests.stub_engine import StubEngine

pytestmark = pytest.mark.integration


async def test_stop_while_the_request_is_prepared_ends_the_turn_without_an_error(tmp_path: Path) -> None:
    with StubEngine() as engine:
        app = start_app(tmp_path / "data", **engine.app_overrides())
        try:
            await asyncio.to_thread(app.wait_ready)
            chat = ChatSocket(app.url, None)
            await chat.connect()
            engine.hold_path = "/tokenize"  # build_request counts the prompt's tokens: held there
            start, log_start = len(chat.events), len(app.log_text())
            # More bytes than the window's tokens: its upper bound does not fit, so it is counted before it is sent
            # (a short message far within the window goes uncounted: backend.chat.context.upper_bound)
            await chat.send("Hello " * 700)
            assert await asyncio.to_thread(engine.held.wait, 180), "the turn reached the token count"
            await chat.sio.emit("stop")
            await chat.wait_for("task_end", await chat.wait_for("task_start", start))
            engine.hold_path = None
            engine.release.set()
            shown = [(d.get("name"), d.get("output")) for e, d in chat.events[start:] if e == "new_message"]
            logged = app.log_text()[log_start:]
            # the next message is answered as usual
            await chat.ask("Hello again")
            assert chat.last_reply is not None and rendered_finished(chat.last_reply), chat.last_reply
            await chat.close()
        finally:
            app.kill()
    # the app's log lines (time - level - logger - message): the reply stopped before it began, no error
    records = [line.split(" - ", 3) for line in logged.splitlines() if line.count(" - ") >= 3]
    began = [r[1:3] for r in records if r[3].endswith(" stopped before it began")]
    assert began == [["INFO", "backend.chat.live"]], logged
    assert [r for r in records if r[1] in ("ERROR", "CRITICAL")] == [], logged
    # the page: the chat's own stop notice last, and no error on the way
    assert shown[-1] == (SYSTEM_AUTHOR, t("stopped", "en-US")), shown
    assert not [(name, text) for name, text in shown if name == "Error" or "⚠" in str(text)], shown
    assert engine.conversations() == [[("user", "Hello again")]], "the stopped message never reached the model"
