"""engine.keep_running (backend/serving/kept.py) with the real llama.cpp server serving the offline demo model: the
engine outlives the app's service, the next service adopts it (same process, same counters, ready without a
start), a changed launch replaces it, keep_running off stops it, and `stop-engine` stops one left running."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from backend.chat.service import ChatService
from backend.config import ROOT, AppConfig, load_config
from backend.engines.llamacpp import DEFAULT_PREFIX
from backend.ops.health import health_payload
from backend.ops.prometheus_text import sample_totals
from backend.serving.kept import RUN_MARK, find_kept
from backend.serving.process import group_alive
from tests.launching import serving
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

PREDICTED = "llamacpp:tokens_predicted_total"
ASK = [{"role": "user", "content": "Name three colours."}]


def env_of(data: Path, cache: Path, canary: Path, **overrides: str) -> dict[str, str]:
    env = {
        "ERNIE_ENGINE__NAME": "llama.cpp",
        "ERNIE_SERVER__PORT": "0",
        "ERNIE_PATHS__DATA_DIR": str(data),
        "ERNIE_PATHS__CACHE_DIR": str(cache),
        "ERNIE_CANARY__DIR": str(canary),
        "ERNIE_LLAMACPP__N_CTX": "2048",
        "ERNIE_TIMEOUTS__STARTUP_S": "240",
        "HF_HUB_OFFLINE": "1",
    }
    env.update(overrides)
    return env


@pytest.fixture
def folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    if not (DEFAULT_PREFIX / "bin" / "llama-server").is_file():
        pytest.fail("llama-server is missing: make setup builds it")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the offline machine: the demo model answers
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    return {"data": tmp_path / "data", "cache": ROOT / ".cache" / "kept-engine", "canary": tmp_path / "canary"}


@pytest_asyncio.fixture
async def leftovers(folders: dict[str, Path]) -> AsyncIterator[None]:
    """Whatever a test leaves running in its data folder is stopped after it."""
    yield
    cfg = load_config(environ=env_of(**folders))
    kept = find_kept(cfg)
    if kept is not None:
        os.killpg(kept.pid, 9)


async def predicted(service: ChatService) -> float:
    async with httpx.AsyncClient(base_url=service.endpoint.base_url, trust_env=False, timeout=10) as http:
        text = (await http.get("/metrics", headers=service.endpoint.headers)).text
    return sample_totals(text)[PREDICTED]


async def reply(service: ChatService) -> str:
    pieces = []
    async with service.client.stream(ASK, temperature=0, max_tokens=24) as s:
        async for piece in s:
            pieces.append(str(piece))
    return "".join(pieces)


def config(folders: dict[str, Path], **overrides: str) -> AppConfig:
    return load_config(environ=env_of(**folders, **overrides))


@pytest.mark.usefixtures("leftovers")
async def test_the_next_service_adopts_the_engine_kept_running_and_a_changed_launch_replaces_it(
    folders: dict[str, Path],
) -> None:
    keep = {"ERNIE_ENGINE__KEEP_RUNNING": "true"}
    first = await serving(config(folders, **keep))
    pid = first.supervisor.status.pid
    assert pid is not None and not first.supervisor.status.adopted
    assert await reply(first)
    generated = await predicted(first)
    assert generated > 0
    await first.stop()
    assert group_alive(pid), "the engine outlived the service"

    second = await serving(config(folders, **keep))
    try:
        status = second.supervisor.status
        assert status.adopted and status.pid == pid, status
        assert health_payload(second)["engine"]["adopted"] is True, "/healthz says so"
        # The same process: its own counter still holds the first service's tokens, and it goes on answering.
        before = await predicted(second)
        assert before >= generated
        assert await reply(second)
        assert await predicted(second) > before
    finally:
        await second.stop()
    assert group_alive(pid)

    # Another context size is another launch: the kept engine is stopped, a fresh one serves.
    third = await serving(config(folders, **keep, ERNIE_LLAMACPP__N_CTX="1024"))
    try:
        assert not third.supervisor.status.adopted and third.supervisor.status.pid != pid
        await asyncio.to_thread(wait_until, lambda: not group_alive(pid), "the replaced engine to be gone", 30)
        replacement = third.supervisor.status.pid
        assert replacement is not None
    finally:
        await third.stop()

    # keep_running off: the engine the last service kept is stopped at the start, and nothing outlives the stop.
    assert group_alive(replacement)
    fourth = await serving(config(folders, ERNIE_LLAMACPP__N_CTX="1024"))
    own = fourth.supervisor.status.pid
    assert not fourth.supervisor.status.adopted and own not in (None, replacement)
    assert not group_alive(replacement)
    await fourth.stop()
    assert own is not None and not group_alive(own)


@pytest.mark.usefixtures("leftovers")
async def test_stop_engine_stops_the_engine_kept_running(folders: dict[str, Path]) -> None:
    env = env_of(**folders, ERNIE_ENGINE__KEEP_RUNNING="true")
    service = await serving(load_config(environ=env))
    pid = service.supervisor.status.pid
    await service.stop()
    assert pid is not None and group_alive(pid)
    kept = find_kept(load_config(environ=env))
    assert kept is not None and kept.pid == pid
    environ = await asyncio.to_thread(Path(f"/proc/{pid}/environ").read_bytes)
    assert f"{RUN_MARK}={kept.run}".encode() in environ.split(b"\0"), "the engine carries its run mark"

    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "backend", "stop-engine"],
                                   env={**os.environ, **env}, cwd=ROOT, capture_output=True, text=True,
                                   timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"pid {pid}" in done.stdout
    assert not group_alive(pid)
    assert find_kept(load_config(environ=env)) is None
