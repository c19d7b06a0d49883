"""Benchmark metrics on known timings: the numbers are worked out by hand from vLLM's definitions."""

from __future__ import annotations

import pytest

from backend.benchmarks.stats import (
    ONE_ROUND,
    WITHIN_SPREAD,
    RequestResult,
    Spread,
    claim,
    combine_rounds,
    level_metrics,
    level_spread,
    percentile,
    ratio,
    spread,
    spread_text,
    summarize,
)


def test_percentile_interpolates_between_ranks_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 90) == pytest.approx(3.7)  # rank 2.7: 3 + 0.7 * (4 - 3)
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summary_is_in_milliseconds_and_none_without_values() -> None:
    summary = summarize([0.1, 0.2, 0.3])
    assert summary is not None
    assert (summary.mean, summary.p50, summary.p90, summary.p99) == pytest.approx((200, 200, 280, 298))
    assert summarize([]) is None


def test_tpot_excludes_the_first_token_and_single_token_replies() -> None:
    assert RequestResult(True, ttft=0.2, latency=1.2, output_tokens=11).tpot == pytest.approx(0.1)
    assert RequestResult(True, ttft=0.2, latency=0.2, output_tokens=1).tpot is None
    assert RequestResult(False, ttft=0.2, latency=1.2, output_tokens=11).tpot is None


def test_level_metrics_on_known_timings() -> None:
    results = [
        RequestResult(True, ttft=0.1, latency=1.1, itl=[0.1] * 10, output_tokens=11, prompt_tokens=100, first_text=0.1),
        RequestResult(True, ttft=0.3, latency=2.3, itl=[0.2] * 10, output_tokens=11, prompt_tokens=50, first_text=0.4),
        RequestResult(True, ttft=0.5, latency=0.5, itl=[], output_tokens=1, prompt_tokens=30, first_text=0.5),
        RequestResult(False, error="HTTP 500: boom"),
        RequestResult(False, error="HTTP 500: boom"),
    ]
    m = level_metrics(4, results, duration_s=4.0)
    assert (m.concurrency, m.requests, m.completed, m.errors) == (4, 5, 3, 2)
    assert m.total_output_tokens == 23
    assert m.output_tokens_per_s == pytest.approx(23 / 4)
    assert m.requests_per_s == pytest.approx(0.75)
    assert m.mean_prompt_tokens == pytest.approx(60)
    assert m.error_samples == ["HTTP 500: boom"]
    # TTFT over the completed requests: 100, 300, 500 ms
    assert m.ttft_ms is not None
    assert (m.ttft_ms.mean, m.ttft_ms.p50, m.ttft_ms.p90, m.ttft_ms.p99) == pytest.approx((300, 300, 460, 496))
    # TPOT: (1.1 - 0.1) / 10 and (2.3 - 0.3) / 10; the one-token reply has none
    assert m.tpot_ms is not None
    assert (m.tpot_ms.mean, m.tpot_ms.p50, m.tpot_ms.p90, m.tpot_ms.p99) == pytest.approx((150, 150, 190, 199))
    # ITL pools every gap: ten of 100 ms and ten of 200 ms
    assert m.itl_ms is not None
    assert (m.itl_ms.mean, m.itl_ms.p50, m.itl_ms.p90) == pytest.approx((150, 150, 200))
    assert m.e2el_ms is not None
    assert m.e2el_ms.mean == pytest.approx((1100 + 2300 + 500) / 3)
    assert m.first_text_ms is not None and m.first_text_ms.p50 == pytest.approx(400)
    assert set(m.to_dict()) >= {"ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "output_tokens_per_s", "errors"}


def test_level_with_only_failures_has_no_latencies() -> None:
    m = level_metrics(1, [RequestResult(False, error="refused")], duration_s=2.0)
    assert (m.completed, m.errors, m.output_tokens_per_s, m.ttft_ms, m.tpot_ms) == (0, 1, 0.0, None, None)


def test_ratio_handles_missing_values() -> None:
    assert ratio(10.0, 4.0) == 2.5
    assert ratio(None, 4.0) is None and ratio(1.0, 0.0) is None and ratio(1.0, None) is None


def test_spread_is_the_median_and_the_range_of_the_rounds() -> None:
    assert spread([12.0, 10.0, 30.0]) == Spread(median=12.0, low=10.0, high=30.0, rounds=3)
    assert spread([4.0, 1.0, 3.0, 2.0]) == Spread(median=2.5, low=1.0, high=4.0, rounds=4)
    assert spread([7.0]) == Spread(7.0, 7.0, 7.0, 1)
    with pytest.raises(ValueError):
        spread([])


def _round(tok_s: float, ttft_p50: float | None, errors: int = 0, samples: tuple[str, ...] = ()) -> dict:
    ttft = None if ttft_p50 is None else {"mean": ttft_p50 + 1, "p50": ttft_p50, "p90": 2 * ttft_p50, "p99": 0.0}
    return {
        "round": 0,
        "order": 0,
        "concurrency": 4,
        "requests": 32,
        "errors": errors,
        "output_tokens_per_s": tok_s,
        "ttft_ms": ttft,
        "peak_memory_bytes": None,
        "load_before": [0.5, 0.5, 0.5],
        "memory_source": "RSS",
        "error_samples": list(samples),
    }


def test_a_spread_as_a_results_file_and_a_table_show_it() -> None:
    s = spread(iter([2.44, 1.01, 3.56]))  # any iterable, one value per round
    assert s.to_dict() == {"median": 2.44, "min": 1.01, "max": 3.56}
    assert s.to_dict(1) == {"median": 2.4, "min": 1.0, "max": 3.6} and s.to_list(1) == [2.4, 1.0, 3.6]
    assert s.text() == "2.4 (1.0-3.6)" and s.text(2) == "2.44 (1.01-3.56)"
    assert spread([7.0]).text(0) == "7 (7-7)", "one round shows its range too"
    assert spread_text([None, 4.0, 2.0, None]) == "3.0 (2.0-4.0)", "missing values left out"
    assert spread_text([None]) == "-" and spread_text([], missing="–") == "–"


def test_rounds_combine_into_medians_with_ranges_and_keep_each_round() -> None:
    rounds = [_round(100.0, 20.0), _round(80.0, 30.0, errors=2, samples=("HTTP 500",)), _round(90.0, 10.0)]
    level = combine_rounds(rounds)
    assert level["rounds"] == 3 and level["per_round"] == rounds
    assert (level["concurrency"], level["requests"], level["memory_source"]) == (4, 32, "RSS")
    assert level["output_tokens_per_s"] == 90.0 and level["spread"]["output_tokens_per_s"] == [80.0, 100.0]
    assert level["ttft_ms"] == {"mean": 21.0, "p50": 20.0, "p90": 40.0, "p99": 0.0}
    assert level["spread"]["ttft_ms"]["p50"] == [10.0, 30.0] and level["spread"]["ttft_ms"]["p90"] == [20.0, 60.0]
    assert level["errors"] == 2 and level["error_samples"] == ["HTTP 500"], "errors of every round count"
    assert level["peak_memory_bytes"] is None
    # a range for each figure with a value: none for the unmeasured memory, the summed errors or the text fields
    assert set(level["spread"]) == {"concurrency", "requests", "output_tokens_per_s", "ttft_ms"}
    per_round_only = {"load_before", "round", "order"}
    assert set(level) == set(rounds[0]) - per_round_only | {"rounds", "per_round", "spread"}, "kept per round only"
    assert level_spread(level, "ttft_ms", "p50") == Spread(20.0, 10.0, 30.0, 3)


def test_a_round_without_latencies_leaves_the_others_to_the_median() -> None:
    level = combine_rounds([_round(0.0, None, errors=32), _round(50.0, 40.0), _round(60.0, 60.0)])
    assert level["ttft_ms"]["p50"] == 50.0 and level["spread"]["ttft_ms"]["p50"] == [40.0, 60.0]
    assert level["errors"] == 32


def test_a_record_of_one_measurement_has_a_range_of_its_own_value() -> None:
    old = {"concurrency": 1, "output_tokens_per_s": 11.0, "ttft_ms": {"p50": 200.0}}  # written before rounds
    assert level_spread(old, "output_tokens_per_s") == Spread(11.0, 11.0, 11.0, 1)
    assert level_spread(old, "ttft_ms", "p50") == Spread(200.0, 200.0, 200.0, 1)
    assert level_spread(old, "tpot_ms", "p50") is None and level_spread(old, "ttft_ms", "p99") is None


def _times(a: float, b: float) -> str:
    return f"{a / b:.2f}×"


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (Spread(20.0, 18.0, 22.0, 3), Spread(10.0, 9.0, 11.0, 3), "2.00×"),  # apart: the gain is claimed
        (Spread(10.0, 9.0, 11.0, 3), Spread(20.0, 18.0, 22.0, 3), "0.50×"),  # apart the other way
        (Spread(12.0, 10.0, 13.0, 3), Spread(10.0, 8.0, 10.0, 3), WITHIN_SPREAD),  # ranges touch
        (Spread(15.0, 5.0, 16.0, 3), Spread(10.0, 9.0, 11.0, 3), WITHIN_SPREAD),  # one range holds the other
        (
            Spread(10.000000000000004, 10.000000000000004, 10.000000000000004, 3),
            Spread(10.0, 10.0, 10.0, 3),
            WITHIN_SPREAD,
        ),
        (Spread(20.0, 20.0, 20.0, 1), Spread(10.0, 9.0, 11.0, 3), ONE_ROUND),  # a single round shows no spread
    ],
    ids=["apart, higher", "apart, lower", "touching", "nested", "equal up to rounding", "one round"],
)
def test_a_difference_is_claimed_only_beyond_the_spread(a: Spread, b: Spread, expected: str) -> None:
    assert claim(a, b, _times) == expected
    assert claim(None, b, _times) == "–"
