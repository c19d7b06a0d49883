"""`python -m backend bench` against a stand-in engine: rounds alternated, 32 requests per level and round by
default, every figure with its range and each round kept, and the API key in no file it writes."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from backend import cli
from backend.benchmarks.plan import MIN_REQUESTS

KEY = "sk-bench-unit-9f3b2c7d1e"


def bench(url: str, out: Path, *extra: str) -> dict:
    argv = ["bench", "--base-url", url + "/v1", "--model", "ernie", "--datasets", "synthetic"]
    argv += ["--input-len", "16", "--output-len", "4", "--no-baseline", "--no-progress", "--warmup", "0"]
    assert cli.main([*argv, "--out-dir", str(out), *extra]) == 0
    return dict(json.loads((out / "results.json").read_text(encoding="utf-8")))


def test_rounds_alternate_and_every_level_keeps_its_rounds(stub_engine: str, tmp_path: Path) -> None:
    doc = bench(stub_engine, tmp_path, "--concurrency", "1,2", "--app-concurrency", "2", "--repeat", "2")
    runs = {r["target"]: {lv["concurrency"]: lv for lv in r["levels"]} for r in doc["runs"]}
    assert set(runs) == {"server", "app"} and set(runs["server"]) == {1, 2} and set(runs["app"]) == {2}
    measured = sorted(
        (r["order"], target, level, r["round"])
        for target, levels in runs.items()
        for level, lv in levels.items()
        for r in lv["per_round"]
    )
    assert [(t, lv, n) for _, t, lv, n in measured] == [
        ("server", 1, 1), ("server", 2, 1), ("app", 2, 1), ("server", 1, 2), ("server", 2, 2), ("app", 2, 2),
    ], "round 1 whole, then round 2: A B A B, never both rounds of one first"  # fmt: skip
    for levels in runs.values():
        for lv in levels.values():
            assert lv["rounds"] == 2 and len(lv["per_round"]) == 2
            assert lv["requests"] == MIN_REQUESTS, "the floor: 32 requests even at one user"
            assert [r["requests"] for r in lv["per_round"]] == [MIN_REQUESTS] * 2
            assert lv["errors"] == 0, lv["error_samples"]
            # each figure is the median of the rounds' own, its spread their range
            tok_s = [r["output_tokens_per_s"] for r in lv["per_round"]]
            assert lv["output_tokens_per_s"] == pytest.approx(statistics.median(tok_s))
            assert lv["spread"]["output_tokens_per_s"] == [min(tok_s), max(tok_s)]
            ttft = [r["ttft_ms"]["p50"] for r in lv["per_round"]]
            assert lv["ttft_ms"]["p50"] == pytest.approx(statistics.median(ttft))
            assert lv["spread"]["ttft_ms"]["p50"] == [min(ttft), max(ttft)]
    assert doc["settings"]["repeat"] == 2 and doc["settings"]["requests_rule"] == "max(32, 4 x concurrency)"
    [overhead] = doc["overhead"]
    assert overhead["concurrency"] == 2 and overhead["raw_tok_s"]["rounds"] == 2
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "| server (HTTP) | 1 | 32 × 2 | 0 |" in report


def test_a_fixed_request_count_is_sent_as_given(stub_engine: str, tmp_path: Path) -> None:
    doc = bench(
        stub_engine, tmp_path, "--concurrency", "4", "--app-concurrency", "none", "--repeat", "1", "--requests", "3"
    )
    [level] = doc["runs"][0]["levels"]
    assert (level["requests"], level["rounds"], doc["settings"]["requests_rule"]) == (3, 1, "3 (fixed)")


@pytest.mark.parametrize("how", ["command line", "environment"])
def test_the_key_is_in_no_file_the_bench_writes(
    how: str, stub_engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = ["--api-key", KEY] if how == "command line" else []
    if how == "environment":
        monkeypatch.setenv("ERNIE_BENCH_API_KEY", KEY)
    else:
        monkeypatch.delenv("ERNIE_BENCH_API_KEY", raising=False)
    doc = bench(stub_engine, tmp_path, "--concurrency", "1", "--repeat", "1", "--requests", "2", *given)
    assert ("--api-key ***" in doc["command"]) == (how == "command line")
    written = list(tmp_path.iterdir())
    assert {p.name for p in written} >= {"results.json", "report.md"}
    for path in written:
        assert KEY.encode() not in path.read_bytes(), path.name
