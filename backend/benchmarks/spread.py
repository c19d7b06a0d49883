"""One level of plain-HTTP requests sent from several client processes, so the client is not what is measured.

At 16 users and more on a fast GPU, one Python client receives thousands of stream chunks a second (the H200's 16-user
level kept 0.55-0.63 of a core busy in the benchmark's own process): where its event loop falls behind, it takes each
reply's first chunk late, and that delay is counted as the server's. (Measured on the H200 at 16 and 64 users, one
client process and four gave the same time between the client's and vLLM's own time to first token:
results/gpu-h200/ttft-16-users. Faster servers or more users may differ: this measures it.) Here the level's users are
split over N processes (spawned, each with its own event loop and HTTP client: a RawSender), each sending its share of
the requests (every N-th) with its share of the users, in a closed loop as run_level does. All processes start sending
together (a barrier after their start-up); the level's wall time runs from the first start to the last end (perf_counter
is the system's monotonic clock on Linux, the same in every process).

On a machine of few cores the processes compete with the server for them: use it where the server has its own.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import time
from dataclasses import dataclass, field
from multiprocessing.synchronize import Barrier
from typing import Any

from backend.benchmarks.loadgen import RawSender, Sampling, run_level
from backend.benchmarks.stats import RequestResult
from backend.benchmarks.workload import BenchRequest

START_S = 120.0  # longest a process may take to start (spawn, imports) before the level is given up


@dataclass(frozen=True)
class RawTarget:
    """What a client process needs to build its own RawSender (picklable)."""

    base_url: str
    api_key: str = field(repr=False)  # never in a repr, a log or an error
    model: str
    sampling: Sampling
    timeout_s: float


def shares(users: int, processes: int) -> list[int]:
    """The users of each process: as even as can be, none empty (fewer processes than users asked are cut)."""
    processes = max(1, min(processes, users))
    return [users // processes + (1 if i < users % processes else 0) for i in range(processes)]


def _client(
    target: RawTarget, requests: list[BenchRequest], users: int, barrier: Barrier, out: Any, index: int
) -> None:
    """One client process: its sender, the barrier, its share of the level; (index, results, start, end) out."""

    async def level() -> tuple[list[RequestResult], float, float]:
        send = RawSender(target.base_url, target.api_key, target.model, target.sampling, target.timeout_s,
                         connections=users + 4)  # fmt: skip
        try:
            barrier.wait(START_S)
            start = time.perf_counter()
            results, _ = await run_level(send, requests, users)
            return results, start, time.perf_counter()
        finally:
            await send.aclose()

    try:
        results, start, end = asyncio.run(level())
        out.put((index, results, start, end, ""))
    except BaseException as exc:  # the parent reports it; a broken barrier breaks the others too
        out.put((index, [], 0.0, 0.0, f"{type(exc).__name__}: {exc}"))


async def run_level_spread(
    target: RawTarget, requests: list[BenchRequest], users: int, processes: int
) -> tuple[list[RequestResult], float]:
    """Send `requests` with `users` in flight, spread over `processes` client processes; results (in the order of
    `requests`) and the level's wall time. A process that fails raises RuntimeError with its error."""
    split = shares(users, processes)
    if len(split) == 1:
        send = RawSender(target.base_url, target.api_key, target.model, target.sampling, target.timeout_s,
                         connections=users + 4)  # fmt: skip
        try:
            return await run_level(send, requests, users)
        finally:
            await send.aclose()
    ctx = multiprocessing.get_context("spawn")  # not fork: the parent runs an event loop and threads
    barrier, out = ctx.Barrier(len(split)), ctx.Queue()
    workers = [
        ctx.Process(target=_client, args=(target, requests[i :: len(split)], n, barrier, out, i), daemon=True)
        for i, n in enumerate(split)
    ]
    for worker in workers:
        worker.start()
    got: dict[int, tuple[list[RequestResult], float, float]] = {}
    errors = []
    try:
        for _ in workers:
            index, results, start, end, error = await asyncio.to_thread(out.get, True, START_S + target.timeout_s)
            if error:
                errors.append(f"client process {index}: {error}")
            got[index] = (results, start, end)
    except queue.Empty:
        errors.append("a client process sent nothing back in time")
    finally:
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.kill()
    if errors:
        raise RuntimeError("; ".join(errors))
    ordered: list[RequestResult] = []
    for position in range(len(requests)):  # back in the order of `requests`: process i sent every n-th from i
        results = got[position % len(split)][0]
        ordered.append(results[position // len(split)])
    duration = max(end for _, _, end in got.values()) - min(start for _, start, _ in got.values())
    return ordered, duration
