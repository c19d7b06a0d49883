"""Supervision logic against a real (stand-in) child process: readiness, start-up failure, restart, hang, stop."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from backend.chat.client import Endpoint
from backend.config import AppConfig, EngineFlags, load_config
from backend.engines.base import Candidate, LaunchSpec, Weights
from backend.errors import EngineStartError, Phrase
from backend.serving.answers.comparison import Stats, Verdict
from backend.serving.canary import Canary, Rejected
from backend.serving.process import free_port
from backend.serving.supervisor import State, Supervisor
from tests.deadlines import WAIT_S
from tests.stub_engine import command
from tests.waiting import until


def make(tmp_path: Path, *stub_args: str, **env: str) -> tuple[Supervisor, Callable[[list[str]], None]]:
    base = {
        "ERNIE_PATHS__DATA_DIR": str(tmp_path),
        "ERNIE_RESTART__BACKOFF_INITIAL_S": "0.1",
        "ERNIE_RESTART__BACKOFF_MAX_S": "0.5",
        "ERNIE_RESTART__MAX_ATTEMPTS": "3",
        "ERNIE_TIMEOUTS__STARTUP_S": "60",
        "ERNIE_TIMEOUTS__HEALTH_INTERVAL_S": "0.3",
        "ERNIE_TIMEOUTS__HEALTH_TIMEOUT_S": "0.5",
        "ERNIE_TIMEOUTS__HEALTH_FAILURES": "2",
        "ERNIE_TIMEOUTS__STOP_GRACE_S": "2",
    }
    cfg: AppConfig = load_config(environ={**base, **env})
    port = free_port()
    args = [list(stub_args)]

    def prepare() -> LaunchSpec:
        argv = command(port, "m", *args[0])
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
    assert await sup.wait_ready(WAIT_S)
    pid = sup.status.pid
    assert pid and alive(pid)
    log = sup.log_path.read_text()
    child_pid = int(log.split("child pid ")[1].split()[0])
    assert alive(child_pid)
    await sup.stop()
    assert sup.status.state == State.STOPPED
    assert not alive(pid) and not alive(child_pid), "the whole process group must be gone"


async def test_a_choice_before_the_first_start_that_fails_leaves_the_configured_engine_starting(tmp_path: Path) -> None:
    sup, _ = make(tmp_path, "--ready-after", "0.2")
    asked: list[str] = []

    async def broken_tune() -> None:
        asked.append("tune")
        raise RuntimeError("the tune broke")

    sup.before_start = broken_tune
    sup.start_background()
    try:
        assert await sup.wait_ready(WAIT_S), sup.status
        assert asked == ["tune"] and sup.before_start is None, "asked once, before the first start"
    finally:
        await sup.stop()


async def test_the_warm_up_runs_before_ready_and_its_time_is_kept(tmp_path: Path) -> None:
    sup, _ = make(tmp_path, "--ready-after", "0.2")
    seen: list[tuple[bool, Phrase | None]] = []

    async def warm_up() -> None:
        seen.append((sup.ready, sup.status.progress))
        await asyncio.sleep(0.2)

    sup.warm_up = warm_up
    sup.start_background()
    try:
        assert await sup.wait_ready(WAIT_S), sup.status
        assert seen == [(False, Phrase("engine.warming_up"))], "once, before ready, with its notice"
        assert sup.status.warmup_s is not None and sup.status.warmup_s >= 0.2
        assert sup.status.progress is None, "the notice goes with the warm-up"
    finally:
        await sup.stop()


@pytest.mark.parametrize("trouble", ["raises", "too slow"])
async def test_a_warm_up_that_fails_or_is_slow_does_not_keep_the_engine_from_ready(
    tmp_path: Path, trouble: str, caplog: pytest.LogCaptureFixture
) -> None:
    sup, _ = make(tmp_path, "--ready-after", "0.2", ERNIE_TIMEOUTS__WARMUP_S="0.5")

    async def warm_up() -> None:
        if trouble == "raises":
            raise EngineStartError.of("engine.not_ready", seconds=1)
        await asyncio.sleep(30)

    sup.warm_up = warm_up
    sup.start_background()
    try:
        assert await sup.wait_ready(WAIT_S), sup.status
        assert sup.status.warmup_s is None and sup.status.progress is None
        said = [r.getMessage() for r in caplog.records if r.name == "backend.serving.supervisor"]
        assert any("warm-up did not finish" in m for m in said), said
    finally:
        await sup.stop()


async def test_exit_during_startup_is_reported_at_once_with_code_and_tail(tmp_path: Path) -> None:
    # A start-up timeout far beyond the wait below: only noticing the exit itself can end the wait in time.
    sup, _ = make(tmp_path, "--exit-at-start", "3", ERNIE_RESTART__MAX_ATTEMPTS="2", ERNIE_TIMEOUTS__STARTUP_S="3600")
    sup.start_background()
    assert not await sup.wait_ready(600)
    st = sup.status
    assert st.state == State.FAILED and st.attempt == 2
    assert isinstance(st.problem, EngineStartError) and st.problem.code == "engine.exited", st.problem
    assert st.problem.params == {"exit_code": 3, "log": sup.log_path}
    assert st.log_tail.splitlines()[-1] == "ValueError: unknown flag --bogus", "the child's last line (the stub's)"
    await sup.stop()


async def test_fixing_the_cause_and_retrying_works(tmp_path: Path) -> None:
    sup, set_args = make(tmp_path, "--exit-at-start", "1", ERNIE_RESTART__MAX_ATTEMPTS="1")
    sup.start_background()
    assert not await sup.wait_ready(WAIT_S)
    assert sup.status.state == State.FAILED
    set_args([])
    sup.request_retry()
    assert await sup.wait_ready(WAIT_S), sup.status
    await sup.stop()


async def test_port_in_use_is_explained(tmp_path: Path) -> None:
    sup, _ = make(tmp_path, ERNIE_RESTART__MAX_ATTEMPTS="1")
    host, port = "127.0.0.1", int(sup.endpoint.base_url.rsplit(":", 1)[1])
    with socket.socket() as blocker:
        blocker.bind((host, port))
        blocker.listen()
        sup.start_background()
        assert not await sup.wait_ready(WAIT_S)
    problem = sup.status.problem
    assert isinstance(problem, EngineStartError) and problem.code == "engine.port_in_use", problem
    assert problem.params == {"port": port, "host": host}
    assert "server.port" in problem.hint
    await sup.stop()


async def test_killed_engine_is_restarted(tmp_path: Path) -> None:
    sup, _ = make(tmp_path)
    sup.start_background()
    assert await sup.wait_ready(WAIT_S)
    first = sup.status.pid
    assert first is not None
    os.killpg(first, signal.SIGKILL)
    await until(lambda: sup.status.restarts == 1 and sup.ready, "one restart, and ready again", interval=0.05)
    second = sup.status.pid
    assert second is not None and second != first and alive(second), "a new engine process runs"
    assert not alive(first)
    await sup.stop()


async def test_hung_engine_is_killed_and_restarted(tmp_path: Path) -> None:
    sup, _ = make(tmp_path)
    sup.start_background()
    assert await sup.wait_ready(WAIT_S)
    first = sup.status.pid
    assert first is not None
    problems: list[object] = []
    sup.on_change(lambda st: problems.append(st.problem) if st.state == State.RESTARTING else None)
    os.kill(first, signal.SIGSTOP)
    await until(lambda: sup.status.restarts == 1 and sup.ready, "one restart, and ready again", interval=0.05)
    assert not alive(first), "the hung process must have been killed"
    [restarting] = problems
    assert isinstance(restarting, EngineStartError) and restarting.code == "engine.restarting"
    assert isinstance(restarting.params["reason"], Phrase) and restarting.params["reason"].code == "reason.hung"
    await sup.stop()


async def test_an_external_server_that_stops_answering_is_waited_for_and_said_so(tmp_path: Path) -> None:
    """The app does not run an external server (engine.name external): when it stops answering, the notice says the
    app waits for it at its address, not that it restarts it; once it answers again the app is ready again."""
    port = free_port()
    argv = command(port, "m")
    server = await asyncio.create_subprocess_exec(*argv, start_new_session=True)
    cfg = load_config(
        environ={
            "ERNIE_PATHS__DATA_DIR": str(tmp_path),
            "ERNIE_RESTART__BACKOFF_INITIAL_S": "0.1",
            "ERNIE_TIMEOUTS__HEALTH_INTERVAL_S": "0.3",
            "ERNIE_TIMEOUTS__HEALTH_TIMEOUT_S": "0.5",
            "ERNIE_TIMEOUTS__HEALTH_FAILURES": "2",
        }
    )
    url = f"http://127.0.0.1:{port}"

    def prepare() -> LaunchSpec:
        return LaunchSpec("external", [], {}, "", 0, "m", "k", url=url)

    sup = Supervisor(cfg, prepare, Endpoint(url, "k", "m"), EngineFlags())
    problems: list[object] = []
    sup.on_change(lambda st: problems.append(st.problem) if st.state == State.RESTARTING else None)
    try:
        sup.start_background()
        assert await sup.wait_ready(WAIT_S)
        server.kill()
        await server.wait()
        await until(lambda: sup.status.state == State.RESTARTING, "the wait for the server", interval=0.05)
        await asyncio.sleep(1.0)  # past the backoff (0.1 s): the app waits for the server, it starts nothing
        assert sup.status.state == State.RESTARTING, "the notice of the wait stays while the server is away"
        [down] = problems
        assert isinstance(down, EngineStartError) and down.code == "engine.external_down", down
        assert down.params["url"] == url and "does not run it" in down.message
        assert "不由本应用启动" in down.localized("zh-CN")[0]
        server = await asyncio.create_subprocess_exec(*argv, start_new_session=True)
        await until(lambda: sup.ready, "ready again", interval=0.05)
    finally:
        await sup.stop()
        if server.returncode is None:
            server.kill()
            await server.wait()


@pytest.mark.parametrize("sig", [signal.SIGKILL])
async def test_crash_loop_gives_up(tmp_path: Path, sig: int) -> None:
    sup, _ = make(tmp_path, ERNIE_RESTART__MAX_ATTEMPTS="2", ERNIE_RESTART__STABLE_AFTER_S="60")
    sup.start_background()
    for _ in range(2):
        assert await sup.wait_ready(WAIT_S)
        pid = sup.status.pid
        assert pid is not None
        os.killpg(pid, sig)
        await until(lambda pid=pid: sup.status.pid != pid, "another start", interval=0.05)
    await until(lambda: sup.status.state == State.FAILED, "the supervisor giving up", interval=0.05)
    problem = sup.status.problem
    assert isinstance(problem, EngineStartError) and problem.code == "engine.crash_streak", problem
    assert problem.params == {"reason": Phrase("reason.exited", exit_code=-sig), "count": 2}
    await sup.stop()


def guarded(tmp_path: Path, plan: dict[str, list[str]], may_refuse: tuple[str, ...] = ()) -> Supervisor:
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
    canary = Canary(cfg, [Candidate("stub", v, may_refuse=v in may_refuse) for v in plan], sys.executable)
    port = free_port()

    def prepare() -> LaunchSpec:
        argv = command(port, "m", *plan[canary.ladder.current.variant])
        spec = LaunchSpec("stub", argv, dict(os.environ), "127.0.0.1", port, "m", "k")
        return spec.with_check(Weights(str(tmp_path / "model"), None, "bfloat16"), "stub-build-1")

    return Supervisor(cfg, prepare, Endpoint(f"http://127.0.0.1:{port}", "k", "m"), EngineFlags(), canary=canary)


async def test_a_candidate_that_dies_of_sigill_is_replaced_by_the_next_and_remembered(tmp_path: Path) -> None:
    plan = {"amx": ["--die-with", "SIGILL"], "avx512": []}
    sup = guarded(tmp_path, plan)
    sup.start_background()
    try:
        assert await sup.wait_ready(WAIT_S), sup.status
        assert sup.canary is not None and sup.canary.ladder.current.variant == "avx512"
        assert sup.canary.ladder.rejected == ["stub amx: crashed with SIGILL during start-up"]
        summary = sup.canary.summary()
        assert summary["candidate"] == "stub avx512" and summary["fallbacks"] == sup.canary.ladder.rejected
    finally:
        await sup.stop()
    again = guarded(tmp_path, plan)  # the next start of the app on this machine
    again.start_background()
    try:
        assert await again.wait_ready(WAIT_S), again.status
        assert again.canary is not None and again.canary.ladder.rejected[0].endswith(
            "(remembered from an earlier start)"
        )
        assert "starting: " + sys.executable in sup.log_path.read_text()
        assert again.log_path.read_text().count("--die-with") == 1, "the crashing candidate is not started again"
    finally:
        await again.stop()
    third = guarded(tmp_path, plan)  # and the start after: told once, as first seen (not "remembered" twice)
    third.start_background()
    try:
        assert await third.wait_ready(WAIT_S), third.status
        remembered = "stub amx: crashed with SIGILL during start-up (remembered from an earlier start)"
        assert third.canary is not None and third.canary.ladder.rejected == [remembered]
    finally:
        await third.stop()


async def test_when_every_candidate_crashes_the_app_says_what_was_tried(tmp_path: Path) -> None:
    sup = guarded(tmp_path, {"amx": ["--die-with", "SIGILL"], "x64": ["--die-with", "SIGSEGV"]})
    sup.start_background()
    try:
        assert not await sup.wait_ready(WAIT_S)
        assert sup.status.state == State.FAILED
        error = sup.status.error or ""
        assert "No configuration of the engine gives correct answers" in error
        assert "stub amx: crashed with SIGILL" in error and "stub x64: crashed with SIGSEGV" in error
        assert "llamacpp.cpu_variant" in (sup.status.hint or "")
    finally:
        await sup.stop()


async def test_a_candidate_the_engine_may_refuse_gives_way_when_it_exits_and_another_stops_the_start(
    tmp_path: Path,
) -> None:
    """FP8 on a vLLM without its kernels exits with an error at start-up: the 16-bit candidate serves instead. The same
    exit of an ordinary candidate (a wrong flag, a port in use) stops the start with its own message."""
    sup = guarded(tmp_path / "a", {"fp8": ["--exit-at-start", "1"], "bfloat16": []}, may_refuse=("fp8",))
    sup.start_background()
    try:
        assert await sup.wait_ready(WAIT_S), sup.status
        assert sup.canary is not None and sup.canary.ladder.current.variant == "bfloat16"
        assert sup.canary.ladder.rejected == ["stub fp8: exited with code 1 during start-up"]
    finally:
        await sup.stop()
    plain = guarded(tmp_path / "b", {"fp8": ["--exit-at-start", "1"], "bfloat16": []})
    plain.start_background()
    try:
        assert not await plain.wait_ready(WAIT_S)
        assert plain.canary is not None and plain.canary.ladder.current.variant == "fp8"
        problem = plain.status.problem
        assert isinstance(problem, EngineStartError), problem
    finally:
        await plain.stop()


@pytest.mark.parametrize(
    ("positions", "said"),
    [(0, "failed to answer: prompt 'en-capital': POST /v1/completions answered HTTP 500"),
     (69, "answers differ from the float32 reference: prompt 'en-capital'")],
)  # fmt: skip
async def test_an_engine_that_fails_the_checks_requests_is_not_said_to_answer_wrongly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, positions: int, said: str
) -> None:
    """An engine whose every check request failed (HTTP 500: stock Debian without python3-dev) compared no answer."""
    cfg = load_config(environ={"ERNIE_PATHS__CACHE_DIR": str(tmp_path / "cache")})
    canary = Canary(cfg, [Candidate("vllm-cpu", None)], sys.executable)

    async def reference(weights: Weights) -> None:
        return None

    async def check(*args: object, **kwargs: object) -> Verdict:
        return Verdict(False, "prompt 'en-capital': POST /v1/completions answered HTTP 500" if not positions
                       else "prompt 'en-capital' position 3: |Δ| 2.1", Stats(positions=positions))  # fmt: skip

    monkeypatch.setattr(canary, "reference", reference)
    monkeypatch.setattr("backend.serving.canary.check_engine", check)
    with pytest.raises(Rejected) as rejected:
        await canary.verify("http://127.0.0.1:9", "k", "m", Weights(str(tmp_path / "m"), None, "bfloat16"), "b")
    assert rejected.value.reason.startswith(said)
