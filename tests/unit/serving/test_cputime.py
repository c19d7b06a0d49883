"""CPU time from /proc: another process's work on the cores is seen, the engine's own and this process's are not.

Each check spins for CPU time, not wall time, and compares amounts that other load on the machine cannot fake."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from backend.serving.cputime import OtherWork, group_cpu_s, machine_busy_s, own_cpu_s
from tests.waiting import wait_until

SPIN = "import time\nwhile time.process_time() < {s}: pass\n"


def spin(cpu_s: float) -> subprocess.Popen[bytes]:
    """A process that works until it has used `cpu_s` seconds of CPU, leading its own process group."""
    return subprocess.Popen([sys.executable, "-c", SPIN.format(s=cpu_s)], start_new_session=True)


def test_the_machine_a_process_group_and_this_process_count_the_cpu_time_they_used() -> None:
    before = machine_busy_s()
    spin(0.5).wait(timeout=60)
    assert machine_busy_s() - before >= 0.45, "the child's work shows in the machine's busy time"
    busy = spin(3.0)
    try:
        wait_until(lambda: group_cpu_s(busy.pid) >= 0.3, "the group's CPU time growing while it works", interval=0.05)
    finally:
        busy.kill()
        busy.wait(timeout=10)
    assert group_cpu_s(busy.pid) == 0.0, "a group with no live process has nothing left to read"
    start = time.process_time()
    before_own = own_cpu_s()
    while time.process_time() - start < 0.2:
        pass
    assert own_cpu_s() - before_own >= 0.18  # read in clock ticks of 0.01 s


def test_other_work_is_told_from_the_engines_own() -> None:
    watch = OtherWork(None)
    watch.start()
    spin(0.6).wait(timeout=60)
    assert watch.seconds()[0] >= 0.55, "another process's work is seen as other work"


def test_a_live_engines_work_is_not_other_work() -> None:
    engine = spin(30.0)
    try:
        counted, uncounted = OtherWork(engine.pid), OtherWork(None)
        counted.start()
        uncounted.start()
        worked = group_cpu_s(engine.pid)
        wait_until(lambda: group_cpu_s(engine.pid) - worked >= 0.6, "the engine working 0.6 s", interval=0.05)
        other_counted, other_uncounted = counted.seconds()[0], uncounted.seconds()[0]
        assert other_uncounted - other_counted >= 0.5, "the engine's group is ours: not other work"
    finally:
        engine.kill()
        engine.wait(timeout=10)
    with pytest.raises(RuntimeError):
        OtherWork(None).share()
