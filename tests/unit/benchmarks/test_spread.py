"""A level sent from several client processes (backend/benchmarks/spread.py), against the stand-in engine process
(tests/stub_engine.py) over HTTP: every request sent once, its result in the order of the requests, the users split."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.benchmarks.loadgen import Sampling
from backend.benchmarks.spread import RawTarget, run_level_spread, shares
from backend.benchmarks.workload import BenchRequest
from backend.serving.process import free_port

STUB = Path(__file__).resolve().parents[2] / "stub_engine.py"
REPLY = "one two three four five"
CHAT_REQUEST = "request POST /v1/chat/completions"


def test_the_users_are_split_evenly_and_no_process_is_empty() -> None:
    assert shares(16, 4) == [4, 4, 4, 4]
    assert shares(10, 4) == [3, 3, 2, 2]
    assert shares(2, 4) == [1, 1]
    assert shares(5, 1) == [5]


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The stand-in engine on its own port: its /v1 address and its log (a line per chat request)."""
    port, log = free_port(), tmp_path / "stub.log"
    argv = [sys.executable, str(STUB), str(port), "stub-model", "--reply", REPLY, "--count-prompt"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", log
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("processes", [1, 3])
async def test_every_request_is_sent_once_and_answered_in_order(stub: tuple[str, Path], processes: int) -> None:
    url, log = stub
    target = RawTarget(url, "a-secret-key", "stub-model", Sampling(temperature=0.0, top_p=1.0), timeout_s=60)
    # Request i has i + 1 words: the stub's prompt count says which request a result answers.
    requests = [BenchRequest([{"role": "user", "content": "word " * (i + 1)}], 8, "synthetic") for i in range(10)]
    results, duration = await run_level_spread(target, requests, users=4, processes=processes)
    assert len(results) == len(requests)
    assert all(r.success for r in results), [r.error for r in results]
    assert all(r.output_tokens > 1 and 0 < r.ttft <= r.latency for r in results)
    assert [r.prompt_tokens for r in results] == [i + 1 for i in range(len(requests))]
    assert log.read_text().count(CHAT_REQUEST) == len(requests)
    # The level's wall time holds its longest request, and the requests of one process run one after another.
    assert duration >= max(r.latency for r in results)
    assert "a-secret-key" not in repr(target)
