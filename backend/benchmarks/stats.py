"""Benchmark metrics with the definitions of `vllm bench serve`: TTFT, TPOT, ITL, E2EL and throughput.

Per request: TTFT is the time to the first streamed chunk, ITL the gaps between successive chunks,
E2EL the time to the last chunk, TPOT = (E2EL - TTFT) / (output tokens - 1) for replies of more than
one token. Per level: throughput is total output tokens (the server's usage counts) / wall time.
Percentiles interpolate linearly between ranks, as numpy's default does. Only stdlib: the HF
baseline's interpreter can import this module too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    """What one streamed request measured; times in seconds from the moment it was sent."""

    success: bool
    ttft: float = 0.0  # first chunk with choices
    latency: float = 0.0  # end-to-end: the last chunk with choices
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    first_text: float | None = None  # first chunk with non-empty text (what a reader sees)
    error: str = ""

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first, or None for replies of one token or less."""
        if not self.success or self.output_tokens <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Summary:
    """Mean and percentiles of one latency, in milliseconds."""

    mean: float
    p50: float
    p90: float
    p99: float


@dataclass(frozen=True)
class LevelMetrics:
    """Everything one concurrency level measured."""

    concurrency: int
    requests: int
    completed: int
    errors: int
    duration_s: float
    total_output_tokens: int
    mean_prompt_tokens: float
    output_tokens_per_s: float
    requests_per_s: float
    ttft_ms: Summary | None
    tpot_ms: Summary | None
    itl_ms: Summary | None
    e2el_ms: Summary | None
    first_text_ms: Summary | None
    error_samples: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile of `values` with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values_s: Sequence[float]) -> Summary | None:
    """Mean, P50, P90 and P99 of durations given in seconds, in milliseconds; None when there are none."""
    if not values_s:
        return None
    ms = [v * 1000 for v in values_s]
    p50, p90, p99 = (percentile(ms, p) for p in PERCENTILES)
    return Summary(mean=sum(ms) / len(ms), p50=p50, p90=p90, p99=p99)


def level_metrics(concurrency: int, results: Sequence[RequestResult], duration_s: float) -> LevelMetrics:
    """Aggregate the results of one level run over `duration_s` seconds of wall time."""
    done = [r for r in results if r.success]
    tokens = sum(r.output_tokens for r in done)
    tpots = [t for t in (r.tpot for r in done) if t is not None]
    errors = [r.error for r in results if not r.success]
    return LevelMetrics(
        concurrency=concurrency,
        requests=len(results),
        completed=len(done),
        errors=len(errors),
        duration_s=duration_s,
        total_output_tokens=tokens,
        mean_prompt_tokens=sum(r.prompt_tokens for r in done) / len(done) if done else 0.0,
        output_tokens_per_s=tokens / duration_s if duration_s > 0 else 0.0,
        requests_per_s=len(done) / duration_s if duration_s > 0 else 0.0,
        ttft_ms=summarize([r.ttft for r in done]),
        tpot_ms=summarize(tpots),
        itl_ms=summarize([gap for r in done for gap in r.itl]),
        e2el_ms=summarize([r.latency for r in done]),
        first_text_ms=summarize([r.first_text for r in done if r.first_text is not None]),
        error_samples=sorted(set(errors))[:5],
    )


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is zero."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator
