"""Chainlit's pauses (backend/web/pauses.py): taken out of its message and step constructors and its message
handler only; longer sleeps and the rest of `time` and `asyncio` are theirs."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import time
from typing import Any

import chainlit as cl
import pytest
from chainlit.context import init_http_context

from backend.web import pauses


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every time.sleep of the process, recorded instead of slept; Chainlit's modules with the real `time` for the
    test (whether or not app.py changed them before, in this process) and as they were afterwards."""
    for name in pauses.MODULES:
        monkeypatch.setattr(importlib.import_module(name), "time", time)
    monkeypatch.setattr(importlib.import_module(pauses.SOCKET), "asyncio", asyncio)
    calls: list[float] = []
    monkeypatch.setattr(time, "sleep", calls.append)
    return calls


def make_message_and_step() -> None:
    init_http_context()  # a message and a step need a Chainlit context (and a running event loop)
    cl.Message(content="hello")
    importlib.import_module("chainlit.step").Step(name="a step")


async def test_the_installed_chainlit_pauses_in_its_constructors(slept: list[float]) -> None:
    # Pins the reason for the module: a Chainlit release without the pause shows here (drop backend/web/pauses.py).
    make_message_and_step()
    assert slept == [pauses.PAUSE_S, pauses.PAUSE_S]


async def test_without_the_pauses_a_message_and_a_step_sleep_not(slept: list[float]) -> None:
    changed = pauses.without_chainlit_pauses()
    assert changed == [pauses.SOCKET, *pauses.MODULES]
    make_message_and_step()
    assert slept == []
    assert pauses.without_chainlit_pauses() == []  # a second call changes nothing


def test_longer_sleeps_and_the_rest_of_time_are_time_s_own(slept: list[float]) -> None:
    pauses.without_chainlit_pauses()
    changed = importlib.import_module("chainlit.message").time
    changed.sleep(0.25)
    assert slept == [0.25]
    assert changed.monotonic is time.monotonic and changed.time is time.time


def test_the_installed_chainlit_pauses_before_on_message() -> None:
    # Pins the reason for the socket's part: a Chainlit release that no longer awaits it shows here.
    source = inspect.getsource(importlib.import_module(pauses.SOCKET).process_message)
    assert f"await asyncio.sleep({pauses.PAUSE_S})" in source
    assert source.index("asyncio.sleep") < source.index("on_message(message)")


async def test_the_handler_s_pause_is_one_turn_of_the_loop_and_longer_sleeps_sleep(
    slept: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    pauses.without_chainlit_pauses()
    changed = importlib.import_module(pauses.SOCKET).asyncio
    awaited: list[float] = []
    real_sleep = asyncio.sleep

    async def recorded(seconds: float, result: Any = None) -> Any:
        awaited.append(seconds)
        return await real_sleep(0, result)

    monkeypatch.setattr(asyncio, "sleep", recorded)
    assert await changed.sleep(pauses.PAUSE_S) is None
    assert await changed.sleep(30, "kept") == "kept"  # a session's timeout still waits its time
    assert awaited == [0, 30]
    assert changed.CancelledError is asyncio.CancelledError and changed.create_task is asyncio.create_task
