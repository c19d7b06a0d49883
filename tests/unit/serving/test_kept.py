"""backend/serving/kept.py: what identifies a launch, and what proves a process left running is ours."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.config import AppConfig, load_config
from backend.engines.base import LaunchSpec
from backend.serving.kept import RUN_MARK, find_kept, fingerprint, is_ours, marked
from backend.serving.state_file import write_state

ARGV = ["python", "-m", "vllm.entrypoints.cli.main", "serve", "m", "--port", "8100"]


def spec(**changes: object) -> LaunchSpec:
    base = LaunchSpec("vllm", list(ARGV), {**os.environ, "VLLM_API_KEY": "k1"}, "127.0.0.1", 8100, "m", "k1",
                      build="vllm 0.26")  # fmt: skip
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_the_fingerprint_changes_with_the_command_line_the_engine_environment_and_the_build() -> None:
    same = fingerprint(spec())
    assert fingerprint(spec()) == same
    assert fingerprint(spec(argv=[*ARGV, "--max-num-seqs", "8"])) != same
    assert fingerprint(spec(env={**os.environ, "VLLM_API_KEY": "k2"})) != same
    assert fingerprint(spec(env={**os.environ, "VLLM_API_KEY": "k1", "VLLM_CPU_KVCACHE_SPACE": "2"})) != same
    assert fingerprint(spec(build="vllm 0.27")) != same
    assert fingerprint(spec(engine="vllm-cpu")) != same


def test_the_fingerprint_ignores_the_run_mark_and_what_the_engine_inherits_unchanged() -> None:
    same = fingerprint(spec())
    assert fingerprint(marked(spec(), "a1")) == fingerprint(marked(spec(), "b2")) == same
    trimmed = {k: v for k, v in os.environ.items() if k != "PATH"}  # an inherited variable, not one the engine adds
    assert fingerprint(spec(env={**trimmed, "VLLM_API_KEY": "k1"})) == same


@pytest.fixture
def marked_child() -> Iterator[subprocess.Popen[bytes]]:
    """A process carrying the run mark "r1" in its environment, in its own process group, as engines are started.

    Yielded once it runs its own code: Popen returns while the kernel may still be setting up the new program,
    when /proc/<pid>/environ reads empty (CI's failure: is_ours false right after Popen)."""
    code = "import time; print('up', flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, RUN_MARK: "r1"}, stdout=subprocess.PIPE,
                             start_new_session=True)  # fmt: skip
    assert child.stdout is not None
    assert child.stdout.readline() == b"up\n"
    yield child
    child.kill()
    child.wait()
    child.stdout.close()


def config(tmp_path: Path) -> AppConfig:
    return load_config(environ={"ERNIE_PATHS__DATA_DIR": str(tmp_path)})


def test_a_process_is_ours_only_with_its_run_mark(marked_child: subprocess.Popen[bytes]) -> None:
    assert is_ours(marked_child.pid, "r1")
    assert not is_ours(marked_child.pid, "r2")
    assert not is_ours(marked_child.pid, "")
    assert not is_ours(os.getpid(), "r1"), "a process without the mark (this one) is not an engine of ours"


def test_find_kept_gives_the_recorded_engine_when_it_runs_and_carries_its_mark(
    tmp_path: Path, marked_child: subprocess.Popen[bytes]
) -> None:
    cfg = config(tmp_path)
    assert find_kept(cfg) is None, "no state file"
    write_state(cfg, spec(port=8123), marked_child.pid, "r1", "launch-1")
    kept = find_kept(cfg)
    assert kept is not None
    recorded = (kept.pid, kept.run, kept.launch, kept.port, kept.api_key)
    assert recorded == (marked_child.pid, "r1", "launch-1", 8123, "k1")
    write_state(cfg, spec(port=8123), marked_child.pid, "r0", "launch-1")  # a pid now someone else's
    assert find_kept(cfg) is None
    write_state(cfg, spec(port=8123), marked_child.pid, "r1", "launch-1")
    marked_child.kill()
    marked_child.wait()
    assert find_kept(cfg) is None, "the engine is gone"
