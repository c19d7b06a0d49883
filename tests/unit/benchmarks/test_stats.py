"""Benchmark metrics on known timings: the numbers are worked out by hand from vLLM's definitions."""

from __future__ import annotations

import pytest

from backend.benchmarks.stats import RequestResult, level_metrics, percentile, ratio, summarize


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
