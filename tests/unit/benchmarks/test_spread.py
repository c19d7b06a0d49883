"""A level sent from several client processes (backend/benchmarks/spread.py), against the stand-in engine process
(tests/stub_engine.py) over HTTP: every request sent once, its result in the order of the requests, the users split."""

from __future__ import annotations

import pytest

from backend.benchmarks.loadgen import Sampling
from backend.benchmarks.spread import RawTarget, run_level_spread, shares
from backend.benchmarks.workload import BenchRequest
from tests.conftest import StartStub, StubProcess

REPLY = "one two three four five"


def test_the_users_are_split_evenly_and_no_process_is_empty() -> None:
    assert shares(16, 4) == [4, 4, 4, 4]
    assert shares(10, 4) == [3, 3, 2, 2]
    assert shares(2, 4) == [1, 1]
    assert shares(5, 1) == [5]


@pytest.fixture
def stub(start_stub: StartStub) -> StubProcess:
    """The stand-in engine as a child process, counting each prompt's words (a line in its log per chat request)."""
    stub = start_stub("--reply", REPLY, "--count-prompt")
    stub.wait_listening()
    return stub


@pytest.mark.parametrize("processes", [1, 3])
async def test_every_request_is_sent_once_and_answered_in_order(stub: StubProcess, processes: int) -> None:
    target = RawTarget(stub.url, "a-secret-key", "stub-model", Sampling(temperature=0.0, top_p=1.0), timeout_s=60)
    # Request i has i + 1 words: the stub's prompt count says which request a result answers.
    requests = [BenchRequest([{"role": "user", "content": "word " * (i + 1)}], 8, "synthetic") for i in range(10)]
    results, duration = await run_level_spread(target, requests, users=4, processes=processes)
    assert len(results) == len(requests)
    assert all(r.success for r in results), [r.error for r in results]
    assert all(r.output_tokens > 1 and 0 < r.ttft <= r.latency for r in results)
    assert [r.prompt_tokens for r in results] == [i + 1 for i in range(len(requests))]
    assert stub.chat_requests() == len(requests)
    # The level's wall time holds its longest request, and the requests of one process run one after another.
    assert duration >= max(r.latency for r in results)
    assert "a-secret-key" not in repr(target)
