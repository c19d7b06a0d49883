"""Editing a sent message (.chainlit/config.toml: features.edit_message), over the websocket as the page sends it
(Chainlit's "edit_message" event: the later messages leave the page, and on_message runs again for the message,
with its id and the new text). The model's history follows the edit: the edited message's turn and every later
one are dropped, and the model is asked the new text, never the old one, never both.

The engine is a StubEngine (tests/stub_engine.py) that records every request: what the model saw is read from the
requests themselves."""

from __future__ import annotations

import asyncio
import tomllib
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from backend.config import ROOT
from tests.app_process import RunningApp, start_app
from tests.chat_api import ChatSocket
from tests.stub_engine import StubEngine

pytestmark = pytest.mark.integration

REPLY_TEXT = "The first reply."


def test_editing_is_on_in_the_configuration() -> None:
    features = tomllib.loads((ROOT / ".chainlit" / "config.toml").read_text())["features"]
    assert features["edit_message"] is True


@pytest_asyncio.fixture(scope="module")
async def chat(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[RunningApp, StubEngine]]:
    with StubEngine(reply=REPLY_TEXT) as engine:
        app = start_app(tmp_path_factory.mktemp("edit") / "data", **engine.app_overrides())
        try:
            await asyncio.to_thread(app.wait_ready)
            yield app, engine
        finally:
            app.kill()


async def test_an_edit_of_an_earlier_message_drops_its_turn_and_the_later_ones(chat) -> None:  # type: ignore[no-untyped-def]
    app, engine = chat
    start = len(engine.requests)
    socket = ChatSocket(app.url, None)
    await socket.connect()
    await socket.ask("What is the capital of France?")
    first = socket.last_sent
    await socket.ask("And of Germany?")
    assert first is not None
    await socket.edit(first, "What is the capital of Italy?")  # returns once the app answered it
    await socket.ask("And of Spain?")
    await socket.close()
    italy = [("user", "What is the capital of Italy?")]
    assert engine.conversations()[start:] == [
        [("user", "What is the capital of France?")],
        [("user", "What is the capital of France?"), ("assistant", REPLY_TEXT), ("user", "And of Germany?")],
        italy,
        [*italy, ("assistant", REPLY_TEXT), ("user", "And of Spain?")],
    ]


async def asked_then_edited(app: RunningApp, text: str, edited: str) -> tuple[ChatSocket, int]:
    """A chat that asked `text`, then edited it to `edited` (answered); the socket, and where its events after the
    edit begin."""
    socket = ChatSocket(app.url, None)
    await socket.connect()
    await socket.ask(text)
    assert socket.last_sent is not None
    edit_start = len(socket.events)
    await socket.edit(socket.last_sent, edited)
    return socket, edit_start


async def test_an_edit_of_the_last_message_asks_the_new_text_alone(chat) -> None:  # type: ignore[no-untyped-def]
    app, engine = chat
    start = len(engine.requests)
    socket, edit_start = await asked_then_edited(app, "Hello", "Hello there")
    await socket.ask("Thanks")
    replies = socket.reply_steps(edit_start)
    await socket.close()
    assert engine.conversations()[start:] == [
        [("user", "Hello")],
        [("user", "Hello there")],
        [("user", "Hello there"), ("assistant", REPLY_TEXT), ("user", "Thanks")],
    ]
    assert len(replies) == 2, "the edit's reply and the next one"


async def test_an_edit_to_an_empty_message_is_refused_and_the_model_forgets_the_old_text(chat) -> None:  # type: ignore[no-untyped-def]
    app, engine = chat
    start = len(engine.requests)
    socket, edit_start = await asked_then_edited(app, "Hello", "  \u200b ")
    refused = socket.notices(edit_start)
    await socket.ask("Second try")
    await socket.close()
    assert len(refused) == 1 and "⚠" in refused[0], refused
    assert engine.conversations()[start:] == [[("user", "Hello")], [("user", "Second try")]]
