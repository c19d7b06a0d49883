"""The one restart policy: exponential backoff over failures in a row, a cap, giving up at max_attempts, a new
count after a stable run; and a supervisor whose engine dies at every start going through it round after round."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from backend.config import EngineFlags, RestartSettings, load_config
from backend.engines.base import Endpoint, LaunchSpec
from backend.errors import EngineStartError
from backend.serving.process import free_port
from backend.serving.supervisor import RestartPolicy, State, Status, Supervisor
from tests.deadlines import WAIT_S
from tests.stub_engine import command


def policy(**settings: float) -> RestartPolicy:
    base: dict[str, float] = {"max_attempts": 4, "backoff_initial_s": 0.5, "backoff_max_s": 3, "stable_after_s": 10}
    return RestartPolicy(RestartSettings(**{**base, **settings}))


def delays(p: RestartPolicy, failures: int, uptime_s: float = 0.0) -> list[float]:
    out = []
    for _ in range(failures):
        p.failed(uptime_s)
        out.append(p.delay_s())
    return out


def test_no_failure_no_wait() -> None:
    p = policy()
    assert (p.failures, p.delay_s(), p.exhausted) == (0, 0.0, False)


def test_the_first_failure_waits_the_initial_backoff_then_it_doubles() -> None:
    assert delays(policy(backoff_max_s=100, max_attempts=10), 5) == [0.5, 1.0, 2.0, 4.0, 8.0]


def test_the_wait_is_capped_at_backoff_max() -> None:
    assert delays(policy(backoff_max_s=3, max_attempts=10), 6) == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_a_cap_equal_to_the_initial_backoff_never_grows() -> None:
    assert delays(policy(backoff_initial_s=2, backoff_max_s=2), 3) == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("max_attempts", [1, 2, 4])
def test_it_gives_up_exactly_at_max_attempts(max_attempts: int) -> None:
    p = policy(max_attempts=max_attempts)
    for _ in range(max_attempts - 1):
        p.failed()
        assert not p.exhausted, f"{p.failures} failures of {max_attempts}"
    p.failed()
    assert p.exhausted and p.failures == max_attempts


def test_a_failure_after_a_stable_run_counts_as_the_first_again() -> None:
    p = policy(max_attempts=4, stable_after_s=10)
    delays(p, 3)  # a crash loop, one failure short of giving up
    p.failed(uptime_s=10)  # ...then a run of exactly stable_after_s
    assert p.failures == 1 and p.delay_s() == 0.5 and not p.exhausted


def test_a_crash_before_stable_after_keeps_counting() -> None:
    p = policy(max_attempts=4, stable_after_s=10)
    assert delays(p, 4, uptime_s=9.9) == [0.5, 1.0, 2.0, 3.0]
    assert p.exhausted


def test_reset_starts_over() -> None:
    p = policy(max_attempts=2)
    delays(p, 2)
    assert p.exhausted
    p.reset()
    assert (p.failures, p.delay_s(), p.exhausted) == (0, 0.0, False)
    assert delays(p, 1) == [0.5], "the next round begins with the initial backoff"


# ----- the supervisor going through the policy ---------------------------------------------------------------
@dataclass(frozen=True)
class Seen:
    state: State
    attempt: int
    problem: object


class Watcher:
    """Every state change the supervisor reports, and an event per state for waiting on it."""

    def __init__(self, sup: Supervisor) -> None:
        self.seen: list[Seen] = []
        self.failed = asyncio.Event()
        sup.on_change(self._changed)

    def _changed(self, st: Status) -> None:
        self.seen.append(Seen(st.state, st.attempt, st.problem))
        if st.state == State.FAILED:
            self.failed.set()


def compact(seen: list[Seen]) -> list[State]:
    """The states without repeats (STARTING is reported again when each start begins)."""
    return [s.state for i, s in enumerate(seen) if i == 0 or seen[i - 1].state != s.state]


def attempts(seen: list[Seen]) -> list[int]:
    """Which attempt each RESTARTING and FAILED was about."""
    return [s.attempt for s in seen if s.state in (State.RESTARTING, State.FAILED)]


def dying_supervisor(tmp_path: Path, max_attempts: int) -> tuple[Supervisor, Callable[[], int]]:
    """A supervisor whose stub engine exits with code 3 at every start; and how many starts its log shows."""
    cfg = load_config(
        environ={
            "ERNIE_PATHS__DATA_DIR": str(tmp_path),
            "ERNIE_RESTART__BACKOFF_INITIAL_S": "0.01",
            "ERNIE_RESTART__BACKOFF_MAX_S": "0.02",
            "ERNIE_RESTART__MAX_ATTEMPTS": str(max_attempts),
            "ERNIE_TIMEOUTS__STARTUP_S": "20",
            "ERNIE_TIMEOUTS__STOP_GRACE_S": "2",
        }
    )
    port = free_port()

    def prepare() -> LaunchSpec:
        argv = command(port, "m", "--exit-at-start", "3")
        return LaunchSpec("stub", argv, dict(os.environ), "127.0.0.1", port, "m", "k")  # type: ignore[arg-type]

    sup = Supervisor(cfg, prepare, Endpoint(f"http://127.0.0.1:{port}", "k", "m"), EngineFlags())

    def starts() -> int:
        return sup.log_path.read_text().count("stub engine starting on") if sup.log_path.exists() else 0

    return sup, starts


async def test_an_engine_that_dies_at_every_start_is_retried_then_given_up_until_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []
    delay_s = RestartPolicy.delay_s

    def recorded(self: RestartPolicy) -> float:
        waits.append(delay_s(self))
        return waits[-1]

    monkeypatch.setattr(RestartPolicy, "delay_s", recorded)
    sup, starts = dying_supervisor(tmp_path, max_attempts=3)
    watcher = Watcher(sup)
    sup.start_background()
    try:
        await asyncio.wait_for(watcher.failed.wait(), WAIT_S)
        one_round = [State.STARTING, State.RESTARTING, State.STARTING, State.RESTARTING, State.STARTING, State.FAILED]
        assert compact(watcher.seen) == one_round
        assert attempts(watcher.seen) == [1, 2, 3]
        assert starts() == 3, "max_attempts starts, then no more"
        assert waits == [0.01, 0.02], "the backoff between the starts: initial, doubled (capped at 0.02)"
        st = sup.status
        assert st.state == State.FAILED and not sup.ready
        assert isinstance(st.problem, EngineStartError) and st.problem.code == "engine.exited"
        assert st.problem.params["exit_code"] == 3 and "exit code 3" in (st.error or "")
        assert st.hint and str(sup.log_path) in st.hint
        assert "unknown flag --bogus" in st.log_tail
        restarting = [s.problem for s in watcher.seen if s.state == State.RESTARTING]
        assert restarting and all(isinstance(p, EngineStartError) for p in restarting), "shown while it retries"
        assert not await sup.wait_ready(0.1), "a supervisor that gave up is not waited for"

        # A new chat message asks again: STARTING at once (the old problem still shown), then a new round.
        watcher.failed.clear()
        mark = len(watcher.seen)
        sup.request_retry()
        assert sup.status.state == State.STARTING and sup.status.problem is st.problem
        await asyncio.wait_for(watcher.failed.wait(), WAIT_S)
        again = watcher.seen[mark:]
        assert again[0].state == State.STARTING
        assert compact(again) == one_round, "a whole new round: max_attempts starts again"
        assert attempts(again) == [1, 2, 3], "counted from 1 again"
        assert starts() == 6 and waits == [0.01, 0.02] * 2
    finally:
        await sup.stop()
    assert sup.status.state == State.STOPPED


async def test_request_retry_before_a_start_does_nothing_and_one_allowed_attempt_gives_up_at_once(
    tmp_path: Path,
) -> None:
    sup, starts = dying_supervisor(tmp_path, max_attempts=1)
    watcher = Watcher(sup)
    sup.request_retry()  # not started: nothing to retry
    assert sup.status.state == State.STOPPED and watcher.seen == []
    sup.start_background()
    try:
        await asyncio.wait_for(watcher.failed.wait(), WAIT_S)
        assert compact(watcher.seen) == [State.STARTING, State.FAILED] and attempts(watcher.seen) == [1]
        assert starts() == 1
    finally:
        await sup.stop()
