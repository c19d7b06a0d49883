"""Editing a sent message is off (.chainlit/config.toml: features.edit_message = false). The page shows no edit
button, but the socket still takes Chainlit's "edit_message" event, as the page would send it.

With editing off the product promises that an edit changes nothing the model sees: the conversation stays as it
was sent, and the model is never asked about a text the user cannot see in the history, nor about the old and the
new text together. The engine is a FakeEngine (tests/app_process.py) that records every request: what the model
saw is read from the requests themselves."""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path

import pytest

from backend.config import ROOT
from tests.app_process import FakeEngine, start_app
from tests.chat_api import ChatSocket

pytestmark = pytest.mark.integration

REPLY_TEXT = "The first reply."


def test_editing_is_off_in_the_configuration() -> None:
    features = tomllib.loads((ROOT / ".chainlit" / "config.toml").read_text())["features"]
    assert features["edit_message"] is False


@pytest.mark.xfail(
    strict=True,
    reason="bug: Chainlit 2.12's edit_message handler (chainlit/socket.py) ignores features.edit_message and runs "
    "on_message with the edited text, while the app's ChatSession.history keeps the original turn: the model is "
    "asked [first question, first reply, edited question] (old and new text together) and every later turn "
    "carries both",
)
async def test_edit_sent_while_editing_is_off_changes_nothing_the_model_sees(tmp_path: Path) -> None:
    with FakeEngine(reply=REPLY_TEXT) as engine:
        engine.ready.set()
        app = start_app(tmp_path / "data", **engine.app_overrides())
        try:
            await asyncio.to_thread(app.wait_ready)
            chat = ChatSocket(app.url, None)
            await chat.connect()
            await chat.ask("What is the capital of France?")
            assert chat.last_sent is not None
            await chat.edit(chat.last_sent, "What is the capital of Italy?")  # returns once the app handled it
            await chat.ask("And of Germany?")
            await chat.close()
        finally:
            app.kill()
    first = [("user", "What is the capital of France?")]
    assert engine.conversations() == [
        first,
        [*first, ("assistant", REPLY_TEXT), ("user", "And of Germany?")],
    ], "the edit reached the model"
