"""Ratios a benchmark reports: the server against the HF baseline, and the app's client against plain HTTP."""

from __future__ import annotations

from typing import Any

from backend.benchmarks.stats import ratio


def _by_level(doc: dict[str, Any], dataset: str, target: str) -> dict[int, dict[str, Any]]:
    for run in doc["runs"]:
        if run["dataset"] == dataset and run["target"] == target:
            return {lv["concurrency"]: lv for lv in run["levels"]}
    return {}


def _p50(level: dict[str, Any], key: str) -> float | None:
    return level[key]["p50"] if level.get(key) else None


def _mean(level: dict[str, Any], key: str) -> float | None:
    return level[key]["mean"] if level.get(key) else None


def compare(doc: dict[str, Any]) -> None:
    """Fill doc['comparison'] (server against HF) and doc['overhead'] (app client against plain HTTP)."""
    doc["comparison"], doc["overhead"] = [], []
    for dataset in dict.fromkeys(r["dataset"] for r in doc["runs"]):
        server = _by_level(doc, dataset, "server")
        for level, hf in _by_level(doc, dataset, "hf").items():
            if level in server:
                s = server[level]
                doc["comparison"].append(
                    {
                        "dataset": dataset,
                        "concurrency": level,
                        "server_tok_s": s["output_tokens_per_s"],
                        "hf_tok_s": hf["output_tokens_per_s"],
                        "throughput_ratio": ratio(s["output_tokens_per_s"], hf["output_tokens_per_s"]),
                        "server_ttft_p50_ms": _p50(s, "ttft_ms"),
                        "hf_ttft_p50_ms": _p50(hf, "ttft_ms"),
                        "server_tpot_p50_ms": _p50(s, "tpot_ms"),
                        "hf_tpot_p50_ms": _p50(hf, "tpot_ms"),
                        "ttft_ratio": ratio(_p50(s, "ttft_ms"), _p50(hf, "ttft_ms")),
                        "tpot_ratio": ratio(_p50(s, "tpot_ms"), _p50(hf, "tpot_ms")),
                    }
                )
        for level, app in _by_level(doc, dataset, "app").items():
            if level in server:
                s = server[level]
                raw_p50, app_p50 = _p50(s, "first_text_ms"), _p50(app, "first_text_ms")
                raw_mean, app_mean = _mean(s, "first_text_ms"), _mean(app, "first_text_ms")
                loss = ratio(s["output_tokens_per_s"] - app["output_tokens_per_s"], s["output_tokens_per_s"])
                doc["overhead"].append(
                    {
                        "dataset": dataset,
                        "concurrency": level,
                        "raw_first_text_p50_ms": raw_p50,
                        "app_first_text_p50_ms": app_p50,
                        "added_ttft_p50_ms": None if raw_p50 is None or app_p50 is None else app_p50 - raw_p50,
                        "added_ttft_mean_ms": None if raw_mean is None or app_mean is None else app_mean - raw_mean,
                        "raw_tok_s": s["output_tokens_per_s"],
                        "app_tok_s": app["output_tokens_per_s"],
                        "tok_s_loss_pct": None if loss is None else loss * 100,
                    }
                )
