"""The app process itself: stopped by SIGTERM or killed outright, it leaves no engine behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.app_process import group_alive, start_app

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_engine_outlives_the_app(sig: int, tiny_model: Path, tmp_path: Path) -> None:
    app = start_app(tmp_path / "data", model__id=str(tiny_model))
    try:
        app.wait_ready()
        engine = app.health()["engine"]["pid"]
        assert engine and group_alive(engine), "the engine runs in its own process group"
        os.kill(app.proc.pid, sig)  # the app process only, as an OOM killer or `kill` would
        app.proc.wait(timeout=60)
        deadline = time.monotonic() + 60
        while group_alive(engine) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not group_alive(engine), f"engine processes outlived the app ({signal.Signals(sig).name})"
    finally:
        app.kill()
