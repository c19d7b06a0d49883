"""`python -m backend bench --workload chat`: its options, and a run against the stand-in engine written to
results.json and report.md (one row per number of users), the other workloads' tables left out."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import pytest

from backend import cli
from backend.benchmarks import run as benchmark
from backend.benchmarks.chat_workload import ChatShape
from backend.benchmarks.plan import MIN_REQUESTS
from backend.errors import BenchmarkError


def options(argv: list[str]) -> argparse.Namespace:
    """The checked options of `python -m backend bench ARGV...`."""
    return benchmark.check_options(cli.build_parser().parse_args(["bench", *argv]))


def test_the_chat_shape_comes_from_the_options_with_the_defaults_of_the_module() -> None:
    assert options([]).chat_shape is None
    assert options(["--workload", "chat"]).chat_shape == ChatShape()
    args = options(
        ["--workload", "chat", "--turns", "2", "--message-tokens", "5-9", "--reply-tokens", "16", "--seed", "3"]
    )
    assert args.chat_shape == ChatShape(turns=2, message_tokens=(5, 9), reply_tokens=(16, 16), seed=3)
    assert args.app_levels == []  # plain HTTP only


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (["--turns", "0"], "shape cannot be used"),
        (["--message-tokens", "80-20"], "shape cannot be used"),
        (["--reply-tokens", "0-5"], "shape cannot be used"),
        (["--reply-tokens", "many"], "is not a range of tokens"),
        (["--message-tokens", "1-2-3"], "is not a range of tokens"),
        (["--no-ignore-eos"], "does not apply to --workload chat"),
    ],
)
def test_shapes_that_make_no_sense_are_friendly_errors(bad: list[str], message: str) -> None:
    with pytest.raises(BenchmarkError, match=message):
        options(["--workload", "chat", *bad])


def test_turns_per_level_are_never_fewer_than_the_floor() -> None:
    assert benchmark.chat_turns(1, 4) == MIN_REQUESTS
    assert benchmark.chat_turns(16, 4) == 64
    assert benchmark.chat_turns(1, 4, fixed=8) == MIN_REQUESTS
    assert benchmark.chat_turns(1, 4, fixed=40) == 40
    # every user holds a whole conversation: 16 users in 4-turn conversations need 64 turns, whatever --requests says
    assert benchmark.chat_turns(16, 4, fixed=32, turns_each=4) == 64
    assert benchmark.chat_turns(8, 4, fixed=32, turns_each=4) == 32


def test_a_chat_run_is_written_as_a_table_per_level(stub_engine: str, tmp_path: Path) -> None:
    argv = ["bench", "--base-url", stub_engine + "/v1", "--model", "ernie", "--workload", "chat", "--turns", "2"]
    argv += ["--reply-tokens", "4-8", "--concurrency", "1,2", "--repeat", "2", "--no-progress", "--warmup", "1"]
    assert cli.main([*argv, "--out-dir", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert doc["runs"] == [] and doc["comparison"] == [] and doc["overhead"] == []
    assert doc["settings"]["workload"] == "chat"
    assert doc["settings"]["chat"] == {
        "turns": 2,
        "message_tokens": [20, 80],
        "reply_tokens": [4, 8],
        "seed": 0,
        "pin_slots": 0,
    }
    assert doc["chat"]["shape"] == doc["settings"]["chat"]
    levels = doc["chat"]["levels"]
    assert [lv["users"] for lv in levels] == [1, 2]
    orders = sorted((r["order"], r["users"], r["round"]) for lv in levels for r in lv["per_round"])
    assert orders == [(1, 1, 1), (2, 2, 1), (3, 1, 2), (4, 2, 2)], "levels alternated round by round"
    for lv in levels:
        assert (lv["turns"], lv["conversations"], lv["rounds"], lv["errors"]) == (MIN_REQUESTS, 16, 2, 0)
        assert lv["output_tok_s"] > 0 and lv["first_text_ms"]["p50"] > 0 and lv["decode_tok_s"]["p50"] > 0
        # the level's figure is the median of its rounds' figures, its spread their [min, max] (two rounds: the mean)
        rounds = [r["first_text_ms"]["p50"] for r in lv["per_round"]]
        assert lv["spread"]["first_text_ms"]["p50"] == [min(rounds), max(rounds)]
        assert lv["first_text_ms"]["p50"] == statistics.median(rounds)
        assert all(len(r["load_before"]) == 3 for r in lv["per_round"])
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "## Workload: chat" in report and "first streamed chunk carrying text" in report
    assert "| users | turns × rounds | errors |" in report and "| 1 | 32 × 2 | 0 |" in report
    assert "| 2 | 32 × 2 | 0 |" in report
    headings = [line for line in report.splitlines() if line.startswith("## ")]
    assert headings == ["## Workload: chat"], "the other workloads' tables left out"
