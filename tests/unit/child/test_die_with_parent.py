"""backend/child/die_with_parent.py: the command takes the launcher's place (same pid) and ends when the process
that started it is killed, even by SIGKILL; a launcher whose parent is already gone starts nothing."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from backend.serving.process import DIE_WITH_PARENT, guarded
from tests.deadlines import WAIT_S
from tests.waiting import wait_until

# A parent that starts `sleep` through the launcher, prints its pid, and waits to be killed.
PARENT = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, sys.argv[1], str(os.getpid()), "--", "sleep", "600"])
print(child.pid, flush=True)
time.sleep(600)
"""


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except FileNotFoundError:
        return []


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return True
    return state == "Z"  # a zombie waiting for its reaper has ended


def test_the_app_starts_engines_through_the_launcher() -> None:
    assert guarded(["engine", "--flag"]) == [
        sys.executable,
        str(DIE_WITH_PARENT),
        str(os.getpid()),
        "--",
        "engine",
        "--flag",
    ]
    killed = guarded(["engine"], signal.SIGKILL)
    assert killed[3:] == [str(int(signal.SIGKILL)), "--", "engine"], "another death signal is passed by number"


def test_llama_server_dies_by_sigkill_with_the_app_and_vllm_by_sigterm(tmp_path: Path) -> None:
    # llama-server's exit after a second signal hung with the app gone (it exits from inside its signal handler)
    from backend.config import load_config
    from backend.engines.llamacpp import build_llamacpp_launch

    cfg = load_config(environ={"ERNIE_PATHS__DATA_DIR": str(tmp_path)})
    spec = build_llamacpp_launch(cfg, "/x.gguf", 1, "k", Path("/bin/llama-server"))
    assert spec.death_signal == signal.SIGKILL
    default = next(f.default for f in dataclasses.fields(spec) if f.name == "death_signal")
    assert default == signal.SIGTERM, "the default: vLLM stops its own children"


def kill_parent_and_wait_for_child(parent_argv: list[str], running: Callable[[list[str]], bool], ended: str) -> None:
    """Start a parent that prints its launched child's pid, wait until the child runs its command (`running` of its
    command line), SIGKILL the parent and wait for the child to end (`ended`: what is awaited)."""
    parent = subprocess.Popen(parent_argv, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        wait_until(lambda: running(cmdline(child)), "the launcher becoming the command (exec)", WAIT_S, 0.05)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        wait_until(lambda: gone(child), ended, WAIT_S, 0.05)
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def test_the_command_takes_the_launchers_pid_and_dies_with_its_parent() -> None:
    kill_parent_and_wait_for_child(
        [sys.executable, "-c", PARENT, str(DIE_WITH_PARENT)],
        lambda line: line == ["sleep", "600"],
        "the command ending with its parent (SIGKILL)",
    )


# A command that ignores SIGTERM, as a server hung in its own exit does: only another death signal ends it.
STUBBORN = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)\n"
PARENT_WITH_SIGNAL = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, sys.argv[1], str(os.getpid()), sys.argv[2], "--", sys.executable, "-c",
                          sys.argv[3]])
print(child.pid, flush=True)
child.wait()
"""


def test_a_command_that_ignores_sigterm_ends_with_its_parent_by_the_signal_named() -> None:
    sig = str(int(signal.SIGKILL))
    kill_parent_and_wait_for_child(
        [sys.executable, "-c", PARENT_WITH_SIGNAL, str(DIE_WITH_PARENT), sig, STUBBORN],
        lambda line: "-c" in line,
        "the command ending with its parent (its death signal SIGKILL)",
    )


def test_a_launcher_whose_parent_is_gone_starts_nothing(tmp_path: Path) -> None:
    made = tmp_path / "made"
    # "1" is not our pid: as if the app that started it had died before the death signal was armed
    done = subprocess.run([sys.executable, str(DIE_WITH_PARENT), "1", "--", "touch", str(made)], timeout=WAIT_S)
    assert done.returncode == 1 and not made.exists()
