"""The daily baseline: `bench --snapshot` measures the engine the app runs (from its state file) with the fixed
workload and adds one line to the history; the doctor calls a clear drop against the recent median a regression."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from backend import cli
from backend.benchmarks.snapshot import WORKLOAD, history_line
from backend.config import AppConfig
from backend.ops.baseline_history import read_history, regression
from backend.ops.doctor import OK, SKIP, WARN, check_baseline


def line(tok_s: float, when: str = "2026-12-01T10:00:00+0000") -> dict:
    return {"time": when, "commit": "abc1234", "levels": {"1": {"tok_s": tok_s}}}


def test_a_clear_drop_below_every_recent_snapshot_is_a_regression() -> None:
    history = [line(16.0), line(16.6), line(15.8), line(16.2), line(12.0)]
    found = regression(history)
    assert found is not None and "12.0 tok/s" in found and "median of 16.1" in found


@pytest.mark.parametrize(
    "values",
    [
        [16.0, 16.6, 15.8, 16.2, 15.0],  # 7 % below the median: within what a busy machine moves
        [16.0, 9.0, 15.8, 16.2, 12.0],  # 25 % below the median, but not below every recent one
        [16.0, 12.0],  # too few snapshots to compare
    ],
    ids=["small dip", "not below the recent minimum", "too few"],
)
def test_no_regression_is_called_without_a_clear_drop(values: list[float]) -> None:
    assert regression([line(v) for v in values]) is None


def test_the_doctor_reports_the_baseline() -> None:
    assert check_baseline([]).status == SKIP
    assert check_baseline([line(16.0), line(16.6), line(15.8), line(12.0)]).status == WARN
    ok = check_baseline([line(16.0), line(16.6)])
    assert ok.status == OK and "16.6 tok/s at 1 user" in ok.summary


def level(users: int, tok_s: float, ttft: float, tpot: float, peak: int) -> dict:
    return {
        "concurrency": users,
        "output_tokens_per_s": tok_s,
        "ttft_ms": {"p50": ttft},
        "tpot_ms": {"p50": tpot},
        "peak_memory_bytes": peak,
    }


def test_a_history_line_takes_the_servers_levels_and_peak_memory() -> None:
    doc = {
        "runs": [
            {
                "target": "server",
                "levels": [
                    level(1, 16.04, 210.0, 60.0, 3 * 2**30),
                    level(4, 38.81, 400.0, 95.0, 4 * 2**30),
                ],
            },
            {"target": "app", "levels": [{"concurrency": 1, "output_tokens_per_s": 1.0}]},
        ]
    }
    got = history_line(doc, "vllm-cpu")
    assert got["engine"] == "vllm-cpu" and got["peak_memory_mib"] == 4096
    assert got["levels"] == {
        "1": {"tok_s": 16.0, "ttft_p50_ms": 210.0, "tpot_p50_ms": 60.0},
        "4": {"tok_s": 38.8, "ttft_p50_ms": 400.0, "tpot_p50_ms": 95.0},
    }, "the app-client run is not the engine's figure"
    assert got["device"] and got["time"]


def test_without_a_running_engine_the_snapshot_says_what_to_do(
    make_config: Callable[..., AppConfig], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = make_config()
    monkeypatch.setattr(cli, "load_config", lambda *_: cfg)
    assert cli.main(["bench", "--snapshot"]) == 1
    err = capsys.readouterr().err
    assert "No running engine is recorded" in err and "make run" in err


def test_the_snapshot_measures_the_running_engine_and_adds_one_line(
    stub_engine: str, make_config: Callable[..., AppConfig], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cfg = make_config(paths__data_dir=str(tmp_path / "data"))
    cfg.paths.data.mkdir(parents=True)
    state = {"engine": "vllm-cpu", "base_url": stub_engine, "served_name": "ernie", "pid": None}
    cfg.paths.engine_state.write_text(json.dumps(state))
    cfg.paths.engine_state.with_suffix(".key").write_text("sk-test")
    monkeypatch.setattr(cli, "load_config", lambda *_: cfg)
    assert cli.main(["bench", "--snapshot", "--no-progress", "--out-dir", str(tmp_path / "out")]) == 0
    assert cli.main(["bench", "--snapshot", "--no-progress", "--out-dir", str(tmp_path / "out2")]) == 0
    history = read_history(cfg)
    assert len(history) == 2, "one line per snapshot, appended"
    newest = history[-1]
    assert newest["engine"] == "vllm-cpu"
    assert set(newest["levels"]) == {"1", "4"} == {s for s in WORKLOAD["concurrency"].split(",")}
    assert all(level["tok_s"] > 0 for level in newest["levels"].values())
    doc = json.loads((tmp_path / "out2" / "results.json").read_text())
    assert doc["server"]["base_url"] == stub_engine, "it measured the engine the state file names"
    levels = [lv for run in doc["runs"] if run["target"] == "server" for lv in run["levels"]]
    assert [lv["requests"] for lv in levels] == [WORKLOAD["requests"]] * 2
    assert [lv["rounds"] for lv in levels] == [WORKLOAD["repeat"]] * 2, "the daily figure: a median of rounds"
