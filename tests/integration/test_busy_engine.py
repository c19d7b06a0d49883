"""A busy engine is not a hung one: an engine that is late to answer its health check while its tokens still reach
the app is never restarted, and one that stops writing (frozen) is killed and restarted. The real llama.cpp server
serving the offline demo model; its health check is made to fail by asking it at a path it does not answer."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from backend.chat.service import ChatService
from backend.config import load_config
from backend.serving.supervisor import State
from tests.launching import serving
from tests.waiting import until

pytestmark = pytest.mark.integration

LONG = [{"role": "user", "content": "Write a very long poem about the sea."}]


@pytest_asyncio.fixture
async def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ChatService]:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    cfg = load_config(
        environ={
            "ERNIE_ENGINE__NAME": "llama.cpp",
            "ERNIE_SERVER__PORT": "0",
            "ERNIE_PATHS__DATA_DIR": str(tmp_path / "data"),
            "ERNIE_CANARY__DIR": os.environ.get("ERNIE_CANARY__DIR", str(tmp_path / "canary")),
            "ERNIE_TIMEOUTS__HEALTH_INTERVAL_S": "0.5",
            "ERNIE_TIMEOUTS__HEALTH_TIMEOUT_S": "1",
            "ERNIE_TIMEOUTS__HEALTH_FAILURES": "2",
            "ERNIE_RESTART__BACKOFF_INITIAL_S": "0.5",
        }
    )
    running = await serving(cfg)
    try:
        yield running
    finally:
        await running.stop()


async def test_an_engine_late_to_its_health_check_but_writing_is_left_alone_and_a_frozen_one_restarted(
    service: ChatService,
) -> None:
    sup = service.supervisor
    spec = sup.spec
    assert spec is not None and sup.process is not None and sup.process.pid is not None
    # Every health check fails from now on (404), as a check stuck behind a busy server's work would.
    sup.spec = dataclasses.replace(spec, health_path="/no-such-health-path")
    pieces = 0
    started = time.monotonic()
    async with service.client.stream(LONG, max_tokens=400, temperature=0, ignore_eos=True) as stream:
        async for _ in stream:
            pieces += 1
    took = time.monotonic() - started
    sup.spec = spec  # answered again
    assert took > 3 * sup.cfg.timeouts.health_interval_s, f"the reply lasted several checks ({took:.1f} s)"
    assert pieces > 1 and sup.status.restarts == 0 and sup.status.state == State.READY, sup.status
    assert sup.status.busy_checks >= 2, "the late checks were seen and put down to a busy engine"

    # Frozen: no token, no CPU: after timeouts.health_failures checks it is killed and started again.
    pid = sup.process.pid
    os.killpg(pid, signal.SIGSTOP)
    try:
        await until(lambda: sup.status.restarts > 0, "the frozen engine restarted", interval=0.2)
    finally:
        try:
            os.killpg(pid, signal.SIGCONT)  # in case it still lives
        except ProcessLookupError:
            pass
    assert await sup.wait_ready(120), sup.status
    assert sup.process is not None and sup.process.pid != pid, "a new engine process serves"
