"""The app process itself: stopped by Ctrl-C (SIGINT) or SIGTERM, or killed outright, it leaves no engine behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.app_process import group_alive, start_app
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


# SIGINT (Ctrl-C in the terminal that runs `chainlit run app.py`) stops the app by the same path as SIGTERM
# (uvicorn's graceful shutdown, then the app's shutdown hook): SIGTERM stands for both; SIGKILL runs nothing of
# the app, so the engine's own guard (backend/child/die_with_parent.py) must end it.
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_engine_outlives_the_app(sig: int, tiny_model: Path, tmp_path: Path) -> None:
    app = start_app(tmp_path / "data", model__id=str(tiny_model))
    try:
        app.wait_ready()
        engine = app.health()["engine"]["pid"]
        assert engine and group_alive(engine), "the engine runs in its own process group"
        os.kill(app.proc.pid, sig)  # the app process only, as an OOM killer or `kill` would
        app.proc.wait(timeout=60)
        name = signal.Signals(sig).name
        wait_until(lambda: not group_alive(engine), f"the engine's processes to end after the app's {name}", 60)
    finally:
        app.kill()
