"""Supervision logic against a real (stand-in) child process: readiness, start-up failure, restart, hang, stop."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from backend.chat.client import Endpoint
from backend.config import AppConfig, EngineFlags, load_config
from backend.engines.base import Candidate, LaunchSpec, Weights
from backend.serving.canary import Guard
from backend.serving.process import free_port
from backend.serving.supervisor import State, Supervisor

STUB = Path(__file__).resolve().parents[2] / "stub_engine.py"


def make(tmp_path: Path, *stub_args: str, **env: str) -> tuple[Supervisor, Callable[[list[str]], None]]:
    base = {
        "ERNIE_PATHS__DATA_DIR": str(tmp_path),
        "ERNIE_RESTART__BACKOFF_INITIAL_S": "0.1",
        "ERNIE_RESTART__BACKOFF_MAX_S": "0.5",
        "ERNIE_RESTART__MAX_ATTEMPTS": "3",
        "ERNIE_TIMEOUTS__STARTUP_S": "20",
        "ERNIE_TIMEOUTS__HEALTH_INTERVAL_S": "0.3",
        "ERNIE_TIMEOUTS__HEALTH_TIMEOUT_S": "0.5",
        "ERNIE_TIMEOUTS__HEALTH_FAILURES": "2",
        "ERNIE_TIMEOUTS__STOP_GRACE_S": "2",
    }
    cfg: AppConfig = load_config(environ={**base, **env})
    port = free_port()
    args = [list(stub_args)]

    def prepare() -> LaunchSpec:
        argv = [sys.executable, str(STUB), str(port), "m", *args[0]]
        return LaunchSpec("stub", argv, dict(os.environ), "127.0.0.1", port, "m", "k")

    def set_args(new: list[str]) -> None:
        args[0] = new

    sup = Supervisor(cfg, prepare, Endpoint(f"http://127.0.0.1:{port}", "k", "m"), EngineFlags())
    return sup, set_args


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is not alive
        return fh.read().split(") ")[1][0] != "Z"


async def test_ready_then_stop_leaves_no_process(tmp_path: Path) -> None:
    sup, _ = make(tmp_path, "--ready-after", "0.5", "--spawn-child")
    sup.start_background()
    assert await sup.wait_ready(40)
    pid = sup.status.pid
    assert pid and alive(pid)
    log = sup.log_path.read_text()
    child_pid = int(log.split("child pid ")[1].split()[0])
    assert alive(child_pid)
    await sup.stop()
    assert sup.status.state == State.STOPPED
    assert not alive(pid) and not alive(child_pid), "the whole process group must be gone"


async def test_exit_during_startup_is_reported_at_once_with_code_and_tail(tmp_path: Path) -> None:
    sup, _ = make(tmp_path, "--exit-at-start", "3", ERNIE_RESTART__MAX_ATTEMPTS="2")
    started = time.monotonic()
    sup.start_background()
    assert not await sup.wait_ready(40)
    assert time.monotonic() - started < 10, "a dead child must not wait for the start-up timeout"
    st = sup.status
    assert st.state == State.FAILED and st.attempt == 2
    assert "exit code 3" in (st.error or "")
    assert "unknown flag --bogus" in st.log_tail
    await sup.stop()


async def test_fixing_the_cause_and_retrying_works(tmp_path: Path) -> None:
    sup, set_args = make(tmp_path, "--exit-at-start", "1", ERNIE_RESTART__MAX_ATTEMPTS="1")
    sup.start_background()
    assert not await sup.wait_ready(10)
    assert sup.status.state == State.FAILED
    set_args([])
    sup.request_retry()
    assert await sup.wait_ready(40)
    await sup.stop()


async def test_port_in_use_is_explained(tmp_path: Path) -> None:
    sup, _ = make(tmp_path, ERNIE_RESTART__MAX_ATTEMPTS="1")
    host, port = "127.0.0.1", int(sup.endpoint.base_url.rsplit(":", 1)[1])
    with socket.socket() as blocker:
        blocker.bind((host, port))
        blocker.listen()
        sup.start_background()
        assert not await sup.wait_ready(10)
    assert "already in use" in (sup.status.error or "")
    assert "server.port" in (sup.status.hint or "")
    await sup.stop()


async def test_killed_engine_is_restarted(tmp_path: Path) -> None:
    sup, _ = make(tmp_path)
    sup.start_background()
    assert await sup.wait_ready(40)
    first = sup.status.pid
    assert first is not None
    os.killpg(first, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while (sup.status.restarts == 0 or not sup.ready) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert sup.ready and sup.status.restarts == 1
    assert sup.status.pid != first
    await sup.stop()


async def test_hung_engine_is_killed_and_restarted(tmp_path: Path) -> None:
    sup, _ = make(tmp_path)
    sup.start_background()
    assert await sup.wait_ready(40)
    first = sup.status.pid
    assert first is not None
    os.kill(first, signal.SIGSTOP)
    deadline = time.monotonic() + 20
    while (sup.status.restarts == 0 or not sup.ready) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert sup.ready and sup.status.restarts == 1
    assert not alive(first), "the hung process must have been killed"
    await sup.stop()


@pytest.mark.parametrize("sig", [signal.SIGKILL])
async def test_crash_loop_gives_up(tmp_path: Path, sig: int) -> None:
    sup, _ = make(tmp_path, ERNIE_RESTART__MAX_ATTEMPTS="2", ERNIE_RESTART__STABLE_AFTER_S="60")
    sup.start_background()
    for _ in range(2):
        assert await sup.wait_ready(40)
        pid = sup.status.pid
        assert pid is not None
        os.killpg(pid, sig)
        deadline = time.monotonic() + 10
        while sup.status.pid == pid and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    deadline = time.monotonic() + 10
    while sup.status.state != State.FAILED and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert sup.status.state == State.FAILED
    assert "2 times in a row" in (sup.status.error or "")
    await sup.stop()


def guarded(tmp_path: Path, plan: dict[str, list[str]]) -> Supervisor:
    """A supervisor whose candidates are stub engines started with `plan[variant]` (the canary's check is off:
    a crash alone decides here; the answer check has tests of its own)."""
    cfg = load_config(
        environ={
            "ERNIE_PATHS__DATA_DIR": str(tmp_path / "data"),
            "ERNIE_PATHS__CACHE_DIR": str(tmp_path / "cache"),
            "ERNIE_RESTART__MAX_ATTEMPTS": "1",
            "ERNIE_TIMEOUTS__STARTUP_S": "20",
            "ERNIE_CANARY__ENABLED": "false",
        }
    )
    guard = Guard(cfg, [Candidate("stub", v) for v in plan], sys.executable)
    port = free_port()

    def prepare() -> LaunchSpec:
        argv = [sys.executable, str(STUB), str(port), "m", *plan[guard.current.variant]]
        spec = LaunchSpec("stub", argv, dict(os.environ), "127.0.0.1", port, "m", "k")
        return spec.with_check(Weights(str(tmp_path / "model"), None, "bfloat16"), "stub-build-1")

    return Supervisor(cfg, prepare, Endpoint(f"http://127.0.0.1:{port}", "k", "m"), EngineFlags(), guard=guard)


async def test_a_candidate_that_dies_of_sigill_is_replaced_by_the_next_and_remembered(tmp_path: Path) -> None:
    plan = {"amx": ["--die-with", "SIGILL"], "avx512": []}
    sup = guarded(tmp_path, plan)
    sup.start_background()
    try:
        assert await sup.wait_ready(40), sup.status
        assert sup.guard is not None and sup.guard.current.variant == "avx512"
        assert sup.guard.rejected == ["stub amx: crashed with SIGILL during start-up"]
        summary = sup.guard.summary()
        assert summary["candidate"] == "stub avx512" and summary["fallbacks"] == sup.guard.rejected
    finally:
        await sup.stop()
    again = guarded(tmp_path, plan)  # the next start of the app on this machine
    again.start_background()
    try:
        assert await again.wait_ready(40), again.status
        assert again.guard is not None and again.guard.rejected[0].endswith("(remembered from an earlier start)")
        assert "starting: " + sys.executable in sup.log_path.read_text()
        assert again.log_path.read_text().count("--die-with") == 1, "the crashing candidate is not started again"
    finally:
        await again.stop()


async def test_when_every_candidate_crashes_the_app_says_what_was_tried(tmp_path: Path) -> None:
    sup = guarded(tmp_path, {"amx": ["--die-with", "SIGILL"], "x64": ["--die-with", "SIGSEGV"]})
    sup.start_background()
    try:
        assert not await sup.wait_ready(40)
        assert sup.status.state == State.FAILED
        error = sup.status.error or ""
        assert "No configuration of the engine gives correct answers" in error
        assert "stub amx: crashed with SIGILL" in error and "stub x64: crashed with SIGSEGV" in error
        assert "llamacpp.cpu_variant" in (sup.status.hint or "")
    finally:
        await sup.stop()
