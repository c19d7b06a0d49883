"""Several chat sessions at once through the app's real Chainlit websocket, against the real engine."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from backend.benchmarks.loadtest import run
from tests.app_process import start_app

pytestmark = pytest.mark.integration


def test_concurrent_sessions_all_complete(tiny_model: Path, tmp_path: Path) -> None:
    app = start_app(tmp_path / "data", model__id=str(tiny_model))
    try:
        app.wait_ready()
        report = asyncio.run(run(app.url, sessions=8, duration_s=15, max_tokens=32, app_pid=app.proc.pid))
    finally:
        app.kill()
    summary = report.summary()
    assert summary["replies_failed"] == 0, summary["errors"]
    assert summary["replies_ok"] >= 8, "every session finished at least one reply"
    assert {r.session for r in report.replies} == set(range(8))
    # (a random tiny model may end a reply at its first token: such a reply streams nothing)
    assert all(r.ttft_s is None or r.ttft_s < r.seconds for r in report.replies)
    assert sum(r.ttft_s is not None for r in report.replies) >= len(report.replies) // 2
    assert report.memory and summary["memory_mib"]["max"] > 0


async def _send_three_at_once(url: str) -> list[str]:
    import socketio

    sio = socketio.AsyncClient(reconnection=False)
    finals: list[str] = []
    done = asyncio.Event()

    def on_update(data: dict) -> None:
        text = data.get("output", "")
        if data.get("type") == "assistant_message" and ("Template:" in text or "⚠" in text):
            finals.append(text)
            if len(finals) == 3:
                done.set()

    sio.on("update_message", handler=on_update)
    sio.on("new_message", handler=on_update)
    auth = {"clientType": "webapp", "sessionId": str(uuid.uuid4()), "threadId": None, "userEnv": "{}"}
    await sio.connect(url, socketio_path="/ws/socket.io", transports=["websocket"], auth=auth)
    await sio.emit("connection_successful")
    await asyncio.sleep(1)
    for text in ("first question", "second question", "third question"):
        step = {"id": str(uuid.uuid4()), "threadId": "", "name": "User", "type": "user_message", "output": text,
                "createdAt": datetime.now(UTC).isoformat()}  # fmt: skip
        await sio.emit("client_message", {"message": step, "fileReferences": None})
    try:
        await asyncio.wait_for(done.wait(), 120)
    finally:
        await sio.disconnect()
    return finals


def test_rapid_repeated_sends_each_get_a_whole_reply(tiny_model: Path, tmp_path: Path) -> None:
    app = start_app(tmp_path / "data", model__id=str(tiny_model), chat__max_tokens="24")
    try:
        app.wait_ready()
        finals = asyncio.run(_send_three_at_once(app.url))
    finally:
        app.kill()
    assert len(finals) == 3, "three messages sent at once, three replies"
    assert all("⚠" not in f for f in finals), finals
