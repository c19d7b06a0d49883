"""One process at a time (backend.files): a second holder waits for the first; two app processes starting
together make the demo model's folder once (backend.models.resolve.prepare_demo_model)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from backend.config import ROOT, load_config
from backend.files import one_at_a_time
from backend.models.resolve import DEMO_MARKER, demo_model_dir, prepare_demo_model

WAITER = """
import sys
from pathlib import Path
from backend.files import one_at_a_time
print("trying", flush=True)
with one_at_a_time(Path(sys.argv[1])):
    print("got", flush=True)
"""


def test_a_second_process_waits_until_the_first_lets_go(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    with one_at_a_time(lock):
        argv = [sys.executable, "-c", WAITER, str(lock)]
        waiter = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert waiter.stdout is not None
        assert waiter.stdout.readline().strip() == "trying"
        time.sleep(0.5)
        assert waiter.poll() is None, "the second holder got the lock while the first held it"
    assert waiter.stdout.readline().strip() == "got"
    assert waiter.wait(30) == 0
    waiter.stdout.close()


def test_two_starts_at_once_make_the_demo_model_once(tmp_path: Path) -> None:
    """A stand-in for the converter (the engine's interpreter running backend.child.demo_model): it counts its runs
    and takes its time, so that the second start comes while the first converts."""
    runs = tmp_path / "runs"
    converter = tmp_path / "python"
    converter.write_text(f'#!/bin/sh\necho run >> "{runs}"\nsleep 1\nmkdir -p "$3"\n')
    converter.chmod(0o755)
    cfg = load_config(environ={"ERNIE_PATHS__CACHE_DIR": str(tmp_path / "cache")})
    made: list[Path] = []
    starts = [threading.Thread(target=lambda: made.append(prepare_demo_model(cfg, str(converter)))) for _ in range(2)]
    for start in starts:
        start.start()
    for start in starts:
        start.join(60)
    assert made == [demo_model_dir(cfg)] * 2 and (demo_model_dir(cfg) / DEMO_MARKER).exists()
    assert runs.read_text().splitlines() == ["run"], "converted once; the second start waited and found it made"
