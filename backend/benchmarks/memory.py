"""How much memory a server holds: the RSS of a process tree from /proc, or the server's own /metrics.

A managed engine is a tree (API server, engine core, workers), so its RSS is summed over the tree.
An existing server is only seen through `process_resident_memory_bytes`, which covers the process
that answers /metrics (for vLLM: the API server, not its engine core).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from backend.ops.prometheus_text import sample_totals

log = logging.getLogger(__name__)

PROC = Path("/proc")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _children_map(proc: Path) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def process_tree(pid: int, proc: Path = PROC) -> list[int]:
    """`pid` and all its descendants that exist now."""
    children = _children_map(proc)
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def alive(pid: int, proc: Path = PROC) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def rss_bytes(pid: int, proc: Path = PROC) -> int:
    """Resident memory of one process (0 when it is gone)."""
    try:
        resident_pages = int((proc / str(pid) / "statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return resident_pages * PAGE_SIZE


def tree_rss_bytes(pid: int, proc: Path = PROC) -> int:
    """Resident memory of `pid` and its descendants, summed."""
    return sum(rss_bytes(p, proc) for p in process_tree(pid, proc))


async def metrics_rss_bytes(http: httpx.AsyncClient, base_url: str) -> int | None:
    """`process_resident_memory_bytes` from the server's /metrics, or None when it does not say."""
    try:
        resp = await http.get(base_url.rstrip("/") + "/metrics")
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    value = sample_totals(resp.text).get("process_resident_memory_bytes")
    return int(value) if value is not None else None


class PeakSampler:
    """Samples a memory reading every `interval_s` while active and keeps the peak."""

    def __init__(self, read: Callable[[], Awaitable[int | None]], interval_s: float = 0.5) -> None:
        self.read = read
        self.interval_s = interval_s
        self.peak: int | None = None
        self._task: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        try:
            value = await self.read()
        except Exception as exc:  # a probe failure must never stop a benchmark
            log.debug("memory probe failed: %s", exc)
            return
        if value is not None and (self.peak is None or value > self.peak):
            self.peak = value

    async def _loop(self) -> None:
        while True:
            await self._sample()
            await asyncio.sleep(self.interval_s)

    async def __aenter__(self) -> PeakSampler:
        self.peak = None
        self._task = asyncio.create_task(self._loop(), name="memory-sampler")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._sample()
