"""CPU time, read from /proc: the whole machine's, one process group's (an engine and its workers), this process's.

Two questions are answered with it: whether something other than the engine and the app used the cores while the
tune measured (its figures then say more about that work than about the engine), and whether an engine that is late
to answer its health check is busy (its CPU time still grows) or hung.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


def machine_busy_s() -> float:
    """Seconds of CPU time every core has spent working since boot (not idle, not waiting for I/O)."""
    try:
        fields = (PROC / "stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return 0.0
    # cpu user nice system idle iowait irq softirq steal guest guest_nice: guest time is inside user already
    values = [int(v) for v in fields[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = values
    return (user + nice + system + irq + softirq + steal) * TICK_S


def _stat_fields(pid: str) -> list[str] | None:
    with contextlib.suppress(OSError):
        text = (PROC / pid / "stat").read_text()
        return text[text.rindex(")") + 2 :].split()  # the fields after the command name (which may hold spaces)
    return None


def group_cpu_s(pgid: int) -> float:
    """Seconds of CPU time the live processes of process group `pgid` have used (their threads included)."""
    total = 0.0
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry.name)
        # after the name: state(0) ppid(1) pgrp(2) ... utime(11) stime(12)
        if fields is not None and len(fields) > 12 and int(fields[2]) == pgid:
            total += (int(fields[11]) + int(fields[12])) * TICK_S
    return total


def own_cpu_s() -> float:
    """Seconds of CPU time this process has used, every thread included."""
    times = os.times()
    return times.user + times.system


@dataclass
class Sample:
    at: float
    machine: float
    ours: float


class OtherWork:
    """How much of the machine's cores something other than ours (this process and the engine's group) used.

    start() before the work and share() after it: the other processes' CPU time over the cores' time in between
    (0.0: nothing else ran; 0.5 on 2 cores: one core's worth of other work)."""

    def __init__(self, pgid: int | None, cores: int | None = None) -> None:
        self.pgid = pgid
        self.cores = cores or len(os.sched_getaffinity(0))
        self._start: Sample | None = None

    def _sample(self) -> Sample:
        engine = group_cpu_s(self.pgid) if self.pgid else 0.0
        return Sample(time.monotonic(), machine_busy_s(), engine + own_cpu_s())

    def start(self) -> None:
        self._start = self._sample()

    def seconds(self) -> tuple[float, float]:
        """(CPU seconds other processes used, wall seconds) since start()."""
        if self._start is None:
            raise RuntimeError("OtherWork measured before start()")
        end = self._sample()
        other = (end.machine - self._start.machine) - (end.ours - self._start.ours)
        return max(0.0, other), end.at - self._start.at

    def share(self) -> float:
        """The other processes' share of the cores since start() (rounded to 0.01)."""
        other, wall = self.seconds()
        return round(other / (wall * self.cores), 2) if wall > 0 else 0.0
