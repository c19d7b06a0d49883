"""The engine's child process and what it needs: a free port, a fresh API key, a log file that rotates.

The child runs in its own process group (so stopping it stops its workers too) and gets SIGTERM if the
app dies, even by SIGKILL (unless it is kept running: backend/serving/kept.py); its output is appended to the
engine log, rotated past 20 MiB.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from backend.engines.base import LaunchSpec

LOG_ROTATE_BYTES = 20 * 1024 * 1024
TAIL_LINES = 30
GROUP_GONE_S = 5.0  # how long stop() waits for the child's whole process group to be gone


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


DIE_WITH_PARENT = Path(__file__).resolve().parent.parent / "child" / "die_with_parent.py"


def guarded(argv: list[str], death_signal: int = signal.SIGTERM) -> list[str]:
    """`argv` started through backend/child/die_with_parent.py (run by its path: the engine's working folder may be
    anywhere): it gets `death_signal` if the app dies, even by SIGKILL, and then execs `argv` in its own place."""
    sig = [] if death_signal == signal.SIGTERM else [str(int(death_signal))]
    return [sys.executable, str(DIE_WITH_PARENT), str(os.getpid()), *sig, "--", *argv]


class ProcessGroup:
    """An engine process leading its own process group, its output in a log file: watched, tailed and stopped."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._offset = 0  # where this start's lines begin in the log

    @property
    def pid(self) -> int | None:
        raise NotImplementedError

    def exit_code(self) -> int | None:
        """The process's exit code, or None while it runs."""
        raise NotImplementedError

    async def _reaped(self) -> int | None:
        """Wait for the leader to be gone after SIGKILL; its exit code."""
        raise NotImplementedError

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
        if self.pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    async def stop(self, grace_s: float) -> int | None:
        """Stop the whole process group: SIGTERM, wait up to grace_s, then SIGKILL; return the exit code."""
        if self.pid is None:
            return None
        if self.exit_code() is None:
            self.signal_group(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while self.exit_code() is None and time.monotonic() < deadline:  # noqa: ASYNC110 (a process, no event)
                await asyncio.sleep(0.1)
        # SIGKILL the group even when the leader is gone: its own children may linger.
        self.signal_group(signal.SIGKILL)
        code = await self._reaped()
        await self._group_gone(GROUP_GONE_S)
        return code

    async def _group_gone(self, timeout_s: float) -> bool:
        """Wait until no process of the group is left (SIGKILL is delivered asynchronously)."""
        assert self.pid is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not group_alive(self.pid):
                return True
            await asyncio.sleep(0.02)
        return False


class EngineProcess(ProcessGroup):
    """One child process running the engine in its own process group, output appended to a log file.

    `guard`: the child gets SIGTERM when the app dies (off only for an engine kept running, backend/serving/kept.py)."""

    def __init__(self, spec: LaunchSpec, log_path: Path, guard: bool = True) -> None:
        super().__init__(log_path)
        self.spec = spec
        self.guard = guard
        self.proc: subprocess.Popen[bytes] | None = None

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
                guarded(self.spec.argv, self.spec.death_signal) if self.guard else self.spec.argv,
                cwd=self.spec.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.spec.env,
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    async def _reaped(self) -> int | None:
        assert self.proc is not None
        return await asyncio.to_thread(self.proc.wait)


def group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies waiting for their reaper do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(") ", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def new_api_key() -> str:
    """A fresh random key for one run of the engine."""
    return "sk-local-" + secrets.token_urlsafe(24)
