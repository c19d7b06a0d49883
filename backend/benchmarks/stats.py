"""Benchmark metrics with the definitions of `vllm bench serve`: TTFT, TPOT, ITL, E2EL and throughput.

Per request: TTFT is the time to the first streamed chunk, ITL the gaps between successive chunks,
E2EL the time to the last chunk, TPOT = (E2EL - TTFT) / (output tokens - 1) for replies of more than
one token. Per level: throughput is total output tokens (the server's usage counts) / wall time.
Percentiles interpolate linearly between ranks, as numpy's default does. Across rounds (a level measured
several times, alternated with the other levels and targets), every figure is the median of the rounds with
its min-max range, and a difference is claimed only where the two ranges do not overlap. Only stdlib: the
HF baseline's interpreter can import this module too.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
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


# ----- across rounds: every level is measured in several alternated rounds ---------------------------
WITHIN_SPREAD = "within spread"
ONE_ROUND = "one round: no spread"
SUMMED = ("errors",)  # an error in any round counts; every other figure is the median of the rounds
PER_ROUND = ("round", "order")  # where a round stood in the run: kept in per_round only


@dataclass(frozen=True)
class Spread:
    """One figure over the rounds of a level: the median and the range (min-max) it took."""

    median: float
    low: float
    high: float
    rounds: int

    def overlaps(self, other: Spread) -> bool:
        """Whether the two ranges share a value (up to rounding): a difference of medians is then no evidence."""

        def at_most(a: float, b: float) -> bool:
            return a <= b or math.isclose(a, b, rel_tol=1e-9)

        return at_most(self.low, other.high) and at_most(other.low, self.high)

    def to_dict(self, digits: int | None = None) -> dict[str, float]:
        """{median, min, max}, as a results file keeps a figure; rounded to `digits` where given."""
        values = {"median": self.median, "min": self.low, "max": self.high}
        return values if digits is None else {key: round(value, digits) for key, value in values.items()}

    def to_list(self, digits: int) -> list[float]:
        """[median, min, max], rounded to `digits`."""
        return [round(self.median, digits), round(self.low, digits), round(self.high, digits)]

    def text(self, digits: int = 1) -> str:
        """'median (min-max)' with `digits` decimals, the range shown for one round too."""
        return f"{self.median:.{digits}f} ({self.low:.{digits}f}-{self.high:.{digits}f})"


def spread(values: Iterable[float]) -> Spread:
    """Median, min and max of a figure's values, one per round."""
    got = list(values)
    if not got:
        raise ValueError("spread of no values")
    return Spread(statistics.median(got), min(got), max(got), len(got))


def spread_text(values: Iterable[float | None], digits: int = 1, missing: str = "-") -> str:
    """'median (min-max)' of the values present (None left out), or `missing` where there are none."""
    present = [v for v in values if v is not None]
    return spread(present).text(digits) if present else missing


def claim(a: Spread | None, b: Spread | None, text: Callable[[float, float], str]) -> str:
    """text(median of a, median of b) where the ranges are apart; 'within spread' where they overlap."""
    if a is None or b is None:
        return "–"
    if a.rounds < 2 or b.rounds < 2:
        return ONE_ROUND
    return WITHIN_SPREAD if a.overlaps(b) else text(a.median, b.median)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _combine(values: list[Any]) -> tuple[Any, Any]:
    """(median, [min, max]) of numbers, recursively through dicts of numbers (a latency Summary); Nones left out."""
    present = [v for v in values if v is not None]
    if present and all(_is_number(v) for v in present):
        s = spread(present)
        same = all(v == present[0] for v in present)  # a constant (concurrency, requests) keeps its type
        return present[0] if same else s.median, [s.low, s.high]
    if present and all(isinstance(v, dict) for v in present):
        pairs = {key: _combine([v.get(key) for v in present]) for key in present[0]}
        return {k: m for k, (m, _) in pairs.items()}, {k: r for k, (_, r) in pairs.items() if r is not None}
    return (present[0] if present else None), None


def combine_rounds(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One level's record from its rounds' records: each figure the median over the rounds, `spread` its
    [min, max], `errors` the sum and `error_samples` those of every round, `per_round` the rounds as measured."""
    if not records:
        raise ValueError("no rounds to combine")
    level: dict[str, Any] = {"rounds": len(records)}
    ranges: dict[str, Any] = {}
    for key in records[0]:
        values: list[Any] = [r.get(key) for r in records]
        if key in SUMMED:
            level[key] = sum(values)
        elif key == "error_samples":
            level[key] = sorted({s for v in values for s in v or ()})[:5]
        elif key in PER_ROUND or all(isinstance(v, list) for v in values):
            continue  # per-round readings (load averages) stay in per_round
        else:
            level[key], found = _combine(values)
            if found is not None:
                ranges[key] = found
    return level | {"spread": ranges, "per_round": list(records)}


def level_spread(level: dict[str, Any], key: str, part: str | None = None) -> Spread | None:
    """A figure of a level record (`ttft_ms`, `p50`: a percentile) with its range; a record of one
    measurement (no `spread`, as results written before rounds) has a range of its own value."""
    value = level.get(key)
    low_high = (level.get("spread") or {}).get(key)
    if part is not None:
        value = value.get(part) if isinstance(value, dict) else None
        low_high = low_high.get(part) if isinstance(low_high, dict) else None
    if not isinstance(value, int | float):
        return None
    low, high = low_high if low_high else (value, value)
    return Spread(float(value), float(low), float(high), int(level.get("rounds", 1)))
