"""Pieces of the bench command: options, memory probes, the baseline job, friendly failures."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from backend import cli
from backend.benchmarks import run as benchmark
from backend.benchmarks.baseline import add_baseline, baseline_job
from backend.benchmarks.loadgen import LevelRun, Sampling
from backend.benchmarks.memory import PeakSampler, alive, metrics_rss_bytes, process_tree, rss_bytes, tree_rss_bytes
from backend.benchmarks.stats import RequestResult, level_metrics
from backend.benchmarks.workload import BenchRequest
from backend.errors import BenchmarkError
from backend.serving.process import free_port
from tests.deadlines import WAIT_S
from tests.waiting import wait_alive, wait_until


def options(argv: list[str]) -> argparse.Namespace:
    """The checked options of `python -m backend bench ARGV...`."""
    return benchmark.check_options(cli.build_parser().parse_args(["bench", *argv]))


def test_options_and_their_mistakes(tmp_path: Path) -> None:
    args = options(["--concurrency", "4,1,2,4", "--out-dir", str(tmp_path)])
    assert args.levels == [1, 2, 4] and args.app_levels == [1, 4]
    assert args.dataset_names == ["synthetic", "prompts"] and args.out_dir == tmp_path.resolve()
    assert options(["--app-concurrency", "none"]).app_levels == []
    assert options(["--concurrency", "1,8", "--app-concurrency", "8"]).app_levels == [8]
    for bad, message in (
        (["--concurrency", "0,2"], "positive integers"),
        (["--concurrency", "a"], "positive integers"),
        (["--datasets", "synthetic,sharegpt"], "Unknown dataset"),
        (["--concurrency", "1,2", "--app-concurrency", "4"], "among the --concurrency levels"),
        (["--repeat", "0"], "--repeat must be at least 1"),
        (["--per-user", "0"], "--per-user must be at least 1"),
        (["--requests", "0"], "--requests must be at least 1"),
    ):
        with pytest.raises(BenchmarkError, match=message):
            options(bad)


def test_rounds_and_requests_per_level_by_default_and_as_asked() -> None:
    args = options([])
    assert (args.repeat, args.per_user, args.requests) == (3, 4, None)
    assert options(["--repeat", "5", "--per-user", "2", "--requests", "7"]).repeat == 5


def test_the_old_rounds_option_says_what_replaced_it() -> None:
    with pytest.raises(BenchmarkError, match="--rounds is gone") as caught:
        options(["--rounds", "2"])
    assert "--per-user" in caught.value.hint and "--repeat" in caught.value.hint


def test_the_key_comes_from_the_command_line_else_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ERNIE_BENCH_API_KEY", raising=False)
    assert options([]).api_key == "EMPTY"
    monkeypatch.setenv("ERNIE_BENCH_API_KEY", "sk-from-the-environment")
    assert options([]).api_key == "sk-from-the-environment"
    assert options(["--api-key", "sk-given"]).api_key == "sk-given"


def test_command_prints_friendly_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--concurrency", "x"]) == 1
    assert "bench: Concurrency levels 'x'" in capsys.readouterr().err
    closed = f"http://127.0.0.1:{free_port()}/v1"
    assert cli.main(["bench", "--base-url", closed, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "does not answer" in err and "Check --base-url" in err


def test_process_tree_memory_covers_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(64 << 20); time.sleep(600)"])
    try:
        wait_alive(
            child, lambda: rss_bytes(child.pid) > 60 << 20, "the child holding its 64 MiB", lambda: "", interval=0.05
        )
        assert child.pid in process_tree(os.getpid())
        own = rss_bytes(os.getpid())
        assert tree_rss_bytes(os.getpid()) >= own + (60 << 20)
    finally:
        child.kill()
        child.wait()
    assert rss_bytes(child.pid) == 0  # gone


def test_a_process_that_exited_is_not_alive_even_before_it_is_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    assert alive(child.pid)
    assert child.stdin is not None
    child.stdin.close()  # it exits; until wait() it stays a zombie, which must not count as alive
    wait_until(lambda: not alive(child.pid), "the child that exited no longer counting as alive", interval=0.05)
    assert Path(f"/proc/{child.pid}").exists(), "still a zombie here: not reaped yet"
    child.wait()
    assert not alive(child.pid)


async def test_metrics_memory_and_peak_sampler() -> None:
    text = "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes 1.2345e+09\n"
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=text))
    async with httpx.AsyncClient(transport=transport) as http:
        assert await metrics_rss_bytes(http, "http://engine/") == 1234500000
    missing = httpx.MockTransport(lambda request: httpx.Response(404))
    async with httpx.AsyncClient(transport=missing) as http:
        assert await metrics_rss_bytes(http, "http://engine") is None

    readings = [10, 30, None, 20]  # then 5 for ever
    taken = 0
    all_read = asyncio.Event()

    async def read() -> int | None:
        nonlocal taken
        value = readings[taken] if taken < len(readings) else 5
        taken += 1
        if taken == len(readings):
            all_read.set()
        return value

    async with PeakSampler(read, interval_s=0.01) as sampler:
        await asyncio.wait_for(all_read.wait(), WAIT_S)  # until every reading above was taken
    assert sampler.peak == 30


def _run(tokens: list[int | None], tag: str = "q") -> LevelRun:
    requests = [BenchRequest([{"role": "user", "content": f"{tag}{i}"}], 16, "x") for i in range(len(tokens))]
    results = [
        RequestResult(True, ttft=0.1, latency=1.0, output_tokens=n) if n else RequestResult(False, error="boom")
        for n in tokens
    ]
    return LevelRun(requests, results, level_metrics(2, results, 2.0))


def test_baseline_job_uses_the_servers_token_counts_round_by_round() -> None:
    first, second = _run([16, 9, None]), _run([16, 16, 5], tag="r")  # 9 ended early (EOS); None failed
    args = options(["--hf-threads", "1"])
    one = _run([16], tag="s")
    job, names = baseline_job(
        args, "/no/such/folder", Sampling(0.7, 0.9), {"prompts_zh": {2: [first, second], 1: [one]}}
    )
    assert names == ["prompts_zh"] * 3
    assert job["model"] == "/no/such/folder" and job["threads"] == 1 and job["cache"] == "static"
    assert [lv["concurrency"] for lv in job["levels"]] == [2, 1, 2], "round 1 of every level, then round 2"
    assert [r["max_tokens"] for r in job["levels"][0]["requests"]] == [16, 9, 16]
    assert [r["max_tokens"] for r in job["levels"][2]["requests"]] == [16, 16, 5]
    assert job["levels"][2]["requests"][1]["messages"] == [{"role": "user", "content": "r1"}]


def _hf_level(duration: float, peak: int, failed: bool = False) -> dict:
    done = {"success": True, "ttft": 0.5, "latency": 2.0, "itl": [0.1] * 15, "output_tokens": 16}
    results = [done, {"success": False, "error": "RuntimeError: no"} if failed else done]
    return {"concurrency": 2, "duration_s": duration, "peak_rss_bytes": peak, "results": results}


def test_baseline_rounds_become_one_level_with_medians_and_ranges() -> None:
    result = {
        "weights": "random",
        "levels": [_hf_level(4.0, 100, failed=True), _hf_level(8.0, 123), _hf_level(2.0, 90)],
    }
    doc: dict = {"runs": []}
    add_baseline(doc, ["prompts_zh"] * 3, result)
    [hf] = doc["runs"]
    assert (hf["dataset"], hf["target"]) == ("prompts_zh", "hf")
    [lv] = hf["levels"]
    assert lv["rounds"] == 3 and [r["round"] for r in lv["per_round"]] == [1, 2, 3]
    assert [r["output_tokens_per_s"] for r in lv["per_round"]] == [4.0, 4.0, 16.0]
    assert lv["output_tokens_per_s"] == 4.0 and lv["spread"]["output_tokens_per_s"] == [4.0, 16.0]
    assert (lv["errors"], lv["peak_memory_bytes"], lv["memory_source"]) == (1, 100, "peak RSS")
    assert doc["baseline"] == {"weights": "random"}
