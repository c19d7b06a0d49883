"""The comparison of an engine's log-probabilities (and chat template) with the reference's: pure, into a Verdict."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from backend.engines.dialect import Position, TokenLogprob
from backend.serving.answers.reference import Reference
from backend.serving.answers.tolerance import Tolerance


@dataclass
class Observed:
    """What the engine gave: per prompt name, its positions and (if checked) its own rendering of the messages."""

    positions: dict[str, list[Position]] = field(default_factory=dict)
    prompt_ids: dict[str, list[int]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # prompt name -> why the engine gave nothing usable


@dataclass
class Stats:
    """Figures of one comparison (|Δ| in nats; median/p95/max over the pairs inside the window)."""

    median: float = 0.0
    p95: float = 0.0
    max: float = 0.0
    max_bound: float = 0.0  # largest lower bound of |Δ| for a token only one side lists (inside the window)
    pairs: int = 0
    median_all: float = 0.0  # over every token both sides list, the deep tail included (for information)
    max_all: float = 0.0
    positions: int = 0
    top1_agree: int = 0
    topk_overlap_mean: float = 0.0
    topk_overlap_min: float = 0.0
    near_ties_skipped: int = 0
    topk_misses: int = 0
    template_mismatches: int = 0
    seconds: float = 0.0


@dataclass
class Verdict:
    """The outcome: passed or not, a sentence saying why (naming the worst prompt and position), and the figures."""

    passed: bool
    reason: str
    stats: Stats = field(default_factory=Stats)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"passed": self.passed, "reason": self.reason, "stats": asdict(self.stats)}


def template_mismatch(reference: list[int], engine: list[int]) -> str | None:
    """Describe how the engine's rendering differs from the reference's token ids, or None when equal."""
    if reference == engine:
        return None
    i = next(
        (n for n, (a, b) in enumerate(zip(reference, engine, strict=False)) if a != b), min(len(reference), len(engine))
    )
    got = engine[i] if i < len(engine) else "nothing"
    want = reference[i] if i < len(reference) else "nothing"
    return (
        f"the engine's chat template renders {len(engine)} tokens that differ from the model's {len(reference)} "
        f"at position {i} (engine {got}, model {want})"
    )


def _near_tie(top: list[TokenLogprob], k: int, nats: float) -> bool:
    """True when k or more listed tokens lie within `nats` of the best one."""
    return bool(top) and sum(1 for _, v in top if top[0][1] - v <= nats) >= k


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _compare_position(
    ref: Position, eng: Position, token: int, tolerance: Tolerance
) -> tuple[dict[int, float], dict[int, float], float, list[str]]:
    """One position: |Δ| of the tokens both list (all, and inside the window), the largest one-sided bound, and
    the top-k rule's complaints."""
    ref_map, eng_map = dict(ref.top), dict(eng.top)
    pairs = {t: abs(eng_map[t] - ref_map[t]) for t in ref_map.keys() & eng_map.keys()}
    if token not in pairs and ref.chosen_logprob is not None and eng.chosen_logprob is not None:
        pairs[token] = abs(eng.chosen_logprob - ref.chosen_logprob)
        ref_map.setdefault(token, ref.chosen_logprob)
    ref_best, eng_best = ref.top[0], eng.top[0]
    inside = {t: d for t, d in pairs.items() if ref_best[1] - ref_map[t] <= tolerance.window_nats}
    # A token one side lists and the other does not lies, on the other side, at or below that side's lowest
    # listed log-prob: a lower bound of |Δ| (what exposes shuffled logits when the top lists still look alike).
    ref_floor, eng_floor = min(v for _, v in ref.top), min(v for _, v in eng.top)
    bounds = [v - ref_floor for t, v in eng.top if t not in pairs and eng_best[1] - v <= tolerance.window_nats]
    bounds += [v - eng_floor for t, v in ref.top if t not in pairs and ref_best[1] - v <= tolerance.window_nats]
    missed = []
    # vLLM's check_logprobs_close rule, both ways, skipped where that side's own distribution is a near tie.
    if not _near_tie(ref.top, tolerance.top_k, tolerance.tie_nats) and ref_best[0] not in {
        t for t, _ in eng.top[: tolerance.top_k]
    }:
        missed.append(f"the reference's top token {ref_best[0]} is not in the engine's top {tolerance.top_k}")
    if not _near_tie(eng.top, tolerance.top_k, tolerance.tie_nats) and eng_best[0] not in {
        t for t, _ in ref.top[: tolerance.top_k]
    }:
        missed.append(f"the engine's top token {eng_best[0]} is not in the reference's top {tolerance.top_k}")
    return pairs, inside, max([0.0, *bounds]), missed


def compare(reference: Reference, observed: Observed, tolerance: Tolerance) -> Verdict:
    """Compare an engine's log-probabilities (and chat template) with the reference's; pure."""
    stats = Stats()
    failures: list[str] = []
    every: list[float] = []
    deltas: list[float] = []
    worst = (-1.0, "")  # (|Δ| or bound inside the window, where)
    overlaps: list[float] = []
    for prompt in reference.prompts:
        name = prompt.name
        if name in observed.errors:
            failures.append(f"prompt {name!r}: {observed.errors[name]}")
            continue
        if name in observed.prompt_ids:
            mismatch = template_mismatch(prompt.prompt_ids, observed.prompt_ids[name])
            if mismatch:
                stats.template_mismatches += 1
                failures.append(f"prompt {name!r}: {mismatch}")
        got = observed.positions.get(name)
        if got is None:
            failures.append(f"prompt {name!r}: the engine gave no log-probabilities")
            continue
        if len(got) != len(prompt.positions):
            failures.append(
                f"prompt {name!r}: the engine gave {len(got)} positions, the reference has {len(prompt.positions)}"
            )
            continue
        for p, (ref, eng) in enumerate(zip(prompt.positions, got, strict=True)):
            where = f"prompt {name!r} position {p}"
            stats.positions += 1
            if not eng.top or not ref.top:
                failures.append(f"{where}: no top log-probabilities")
                continue
            pairs, inside, bound, missed = _compare_position(ref, eng, prompt.continuation_ids[p], tolerance)
            every.extend(pairs.values())
            deltas.extend(inside.values())
            stats.max_bound = max(stats.max_bound, bound)
            here = max([bound, *inside.values()])
            if here > worst[0]:
                worst = (here, where)
            k = min(len(ref.top), len(eng.top))
            overlaps.append(len({t for t, _ in ref.top[:k]} & {t for t, _ in eng.top[:k]}) / k)
            stats.top1_agree += ref.top[0][0] == eng.top[0][0]
            stats.near_ties_skipped += _near_tie(ref.top, tolerance.top_k, tolerance.tie_nats)
            if missed:
                stats.topk_misses += 1
                failures.append(f"{where}: {'; '.join(missed)}")
    stats.pairs = len(deltas)
    if deltas:
        stats.median, stats.p95, stats.max = statistics.median(deltas), _percentile(deltas, 0.95), max(deltas)
    if every:
        stats.median_all, stats.max_all = statistics.median(every), max(every)
    if overlaps:
        stats.topk_overlap_mean, stats.topk_overlap_min = statistics.fmean(overlaps), min(overlaps)
    summary = (
        f"{stats.positions} positions: median |Δ| {stats.median:.4f}, max {max(stats.max, stats.max_bound):.4f} nats "
        f"({worst[1] or 'nowhere'}), top-1 agreement {stats.top1_agree}/{stats.positions}, "
        f"top-list overlap {stats.topk_overlap_mean:.2f}"
    )
    if stats.median > tolerance.median_nats:
        failures.append(f"median |Δ logprob| {stats.median:.4f} nats exceeds {tolerance.median_nats}")
    if worst[0] > tolerance.max_nats:
        failures.append(f"{worst[1]}: |Δ logprob| reaches {worst[0]:.4f} nats, more than {tolerance.max_nats}")
    if overlaps and stats.topk_overlap_mean < tolerance.min_overlap:
        failures.append(
            f"the engine's top lists share {stats.topk_overlap_mean:.2f} of the reference's tokens on average, "
            f"less than {tolerance.min_overlap}"
        )
    if not stats.positions and not failures:
        failures.append("the reference has no positions to check")
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        return Verdict(False, f"{failures[0]}{more}; {summary}", stats)
    return Verdict(True, f"agrees with the float32 reference: {summary}", stats)
