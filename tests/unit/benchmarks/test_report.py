"""Report files from a run document: results.json, the Markdown tables, valid PNG plots; comparisons."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from backend.benchmarks.comparison import compare
from backend.benchmarks.report import markdown, write_report
from backend.benchmarks.stats import RequestResult, level_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def level(concurrency: int, ttft: float, tokens: int, duration: float, first_text: float | None = None) -> dict:
    """A level of `concurrency` identical requests of `tokens` tokens, 10 ms apart."""
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


def document() -> dict[str, Any]:
    runs = [
        {"dataset": "synthetic", "target": "server", "levels": [level(1, 0.2, 11, 1.0), level(4, 0.4, 11, 2.0)]},
        {"dataset": "synthetic", "target": "app", "levels": [level(1, 0.25, 11, 1.1)]},
        {"dataset": "synthetic", "target": "hf", "levels": [level(1, 0.5, 11, 2.0), level(4, 1.0, 11, 8.0)]},
        {"dataset": "prompts_zh", "target": "server", "levels": [level(1, 0.3, 21, 2.0)]},
    ]
    doc = {
        "name": "unit",
        "created": "2025-01-01 00:00:00",
        "command": "python -m backend bench --concurrency 1,4",
        "machine": {"cpus": 2, "load_start": [0.1, 0.1, 0.1], "load_end": [1.0, 0.5, 0.2]},
        "server": {"kind": "managed", "engine": "vllm-cpu", "base_url": "http://e", "model": "m", "flags": {}},
        "settings": {"temperature": 0.7, "top_p": 0.9, "ignore_eos": True, "requests_rule": "2 x concurrency"},
        "datasets": {"synthetic": "random words, 64 prompt tokens each"},
        "runs": runs,
        "baseline": {"weights": "random", "dtype": "bfloat16", "cache": "static", "torch_threads": 2},
        "notes": ["a note"],
    }
    compare(doc)
    return doc


def test_comparison_and_overhead_numbers() -> None:
    doc = document()
    by_level = {c["concurrency"]: c for c in doc["comparison"]}
    assert set(by_level) == {1, 4}
    assert by_level[1]["server_tok_s"] == pytest.approx(11.0)
    assert by_level[1]["hf_tok_s"] == pytest.approx(5.5)
    assert by_level[1]["throughput_ratio"] == pytest.approx(2.0)
    assert by_level[4]["throughput_ratio"] == pytest.approx((44 / 2) / (44 / 8))
    assert by_level[1]["ttft_ratio"] == pytest.approx(0.4)
    assert by_level[1]["server_tpot_p50_ms"] == pytest.approx(10.0)
    [overhead] = doc["overhead"]
    assert overhead["concurrency"] == 1
    assert overhead["added_ttft_p50_ms"] == pytest.approx(50.0)
    assert overhead["added_ttft_mean_ms"] == pytest.approx(50.0)
    assert overhead["tok_s_loss_pct"] == pytest.approx((11 - 10) / 11 * 100)


def test_markdown_tables() -> None:
    text = markdown(document())
    assert text.startswith("# Benchmark unit")
    assert "## Dataset: synthetic" in text and "## Dataset: prompts_zh" in text
    header = "| target | conc. | req. | errors | prompt tok | out tok | TTFT | TPOT | ITL | E2EL | out tok/s | req/s |"
    assert header in text
    # the server's level 1: TTFT 200 ms everywhere, TPOT 10 ms, 11 tokens in 1 s
    assert "| server (HTTP) | 1 | 1 | 0 | 64 | 11 | 200 / 200 / 200 / 200 | 10.0 / 10.0 / 10.0 / 10.0 |" in text
    assert "| 11.0 | 1.00 | 3,072 MiB (test) |" in text
    assert "| synthetic | 1 | 11.0 | 5.5 | 2.00 | 200 / 500 ms | 10.0 / 10.0 ms |" in text
    assert "| synthetic | 1 | 200.0 / 250.0 ms | 50.0 ms | 50.0 ms | 11.0 / 10.0 | 9.1 % |" in text
    assert "- Note: a note" in text
    assert "## Dataset: synthetic\n\nrandom words, 64 prompt tokens each\n" in text
    for line in (row for row in text.splitlines() if row.startswith("|")):
        assert line.endswith("|")


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
        assert set(level1[key]) == {"mean", "p50", "p90", "p99"}
    assert {"output_tokens_per_s", "requests_per_s", "errors", "peak_memory_bytes"} <= set(level1)
    for path in written:
        if path.suffix == ".png":
            width, height = png_size(path)
            assert width >= 800 and height >= 300
