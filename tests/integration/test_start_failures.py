"""The real engine failing to start: the cause and log tail are reported, restarts stop after the
limit, and fixing the cause then retrying works without restarting the app."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from backend.chat.service import ChatService
from backend.serving.supervisor import State
from tests.conftest import service_config

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
        assert not await service.supervisor.wait_ready(240)
        st = service.supervisor.status
        assert st.state == State.FAILED and st.attempt == 2, "it gave up after the configured attempts"
        assert "exit code" in (st.error or "")
        assert "max_model_len" in st.log_tail or "max model len" in st.log_tail.lower(), st.log_tail
    finally:
        await service.stop()


async def test_missing_model_then_fixed_works_without_restarting(tiny_model: Path, tmp_path: Path) -> None:
    folder = tmp_path / "models" / "ernie"
    service = ChatService.from_config(service_config(tmp_path / "data", folder, model__fallback="none"))
    service.start()
    try:
        assert not await service.supervisor.wait_ready(60)
        st = service.supervisor.status
        assert st.state == State.FAILED
        assert "neither an existing folder nor a hub id" in (st.error or "") or "does not" in (st.error or "")
        assert st.hint and "model.id" in st.hint
        shutil.copytree(tiny_model, folder)  # the user copies the model into place...
        service.supervisor.request_retry()  # ...and sends another message
        assert await service.supervisor.wait_ready(240), service.supervisor.status
    finally:
        await service.stop()
