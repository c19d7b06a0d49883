"""Several chat sessions at once through the app's real Chainlit websocket, against the real engine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from backend.loadtest import run
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
