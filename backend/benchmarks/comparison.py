"""What a benchmark compares: the server against the HF baseline, and the app's client against plain HTTP.

Each figure is the median over the rounds with its range; a ratio or a difference is claimed only where the
two ranges do not overlap, and is "within spread" where they do (stats.claim). The ratio of the medians is
kept beside each claim for the record.
"""

from __future__ import annotations

from typing import Any

from backend.benchmarks.stats import Spread, claim, level_spread, ratio


def _by_level(doc: dict[str, Any], dataset: str, target: str) -> dict[int, dict[str, Any]]:
    for run in doc["runs"]:
        if run["dataset"] == dataset and run["target"] == target:
            return {lv["concurrency"]: lv for lv in run["levels"]}
    return {}


def _figure(spread: Spread | None) -> dict[str, Any] | None:
    if spread is None:
        return None
    return {"median": spread.median, "min": spread.low, "max": spread.high, "rounds": spread.rounds}


def _median(spread: Spread | None) -> float | None:
    return None if spread is None else spread.median


def _times(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "–"


def _added_ms(a: float, b: float) -> str:
    return f"{a - b:+.1f} ms"


def _loss_pct(app: float, raw: float) -> str:
    return f"{(raw - app) / raw * 100:.1f} %" if raw else "–"


def _against_hf(dataset: str, level: int, s: dict[str, Any], hf: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"dataset": dataset, "concurrency": level}
    for name, key, part in (
        ("tok_s", "output_tokens_per_s", None),
        ("ttft", "ttft_ms", "p50"),
        ("tpot", "tpot_ms", "p50"),
    ):
        mine, theirs = level_spread(s, key, part), level_spread(hf, key, part)
        row[f"server_{name}"], row[f"hf_{name}"] = _figure(mine), _figure(theirs)
        row[f"{name}_ratio"] = ratio(_median(mine), _median(theirs))
        row[f"{name}_claim"] = claim(mine, theirs, _times)
    return row


def _overhead(dataset: str, level: int, s: dict[str, Any], app: dict[str, Any]) -> dict[str, Any]:
    raw_text, app_text = level_spread(s, "first_text_ms", "p50"), level_spread(app, "first_text_ms", "p50")
    raw_tok, app_tok = level_spread(s, "output_tokens_per_s"), level_spread(app, "output_tokens_per_s")
    added = None if raw_text is None or app_text is None else app_text.median - raw_text.median
    loss = None if raw_tok is None or app_tok is None else ratio(raw_tok.median - app_tok.median, raw_tok.median)
    return {
        "dataset": dataset,
        "concurrency": level,
        "raw_first_text_p50_ms": _figure(raw_text),
        "app_first_text_p50_ms": _figure(app_text),
        "added_ttft_p50_ms": added,
        "added_ttft_claim": claim(app_text, raw_text, _added_ms),
        "raw_tok_s": _figure(raw_tok),
        "app_tok_s": _figure(app_tok),
        "tok_s_loss_pct": None if loss is None else loss * 100,
        "tok_s_loss_claim": claim(app_tok, raw_tok, _loss_pct),
    }


def compare(doc: dict[str, Any]) -> None:
    """Fill doc['comparison'] (server against HF) and doc['overhead'] (app client against plain HTTP)."""
    doc["comparison"], doc["overhead"] = [], []
    for dataset in dict.fromkeys(r["dataset"] for r in doc["runs"]):
        server = _by_level(doc, dataset, "server")
        for level, hf in _by_level(doc, dataset, "hf").items():
            if level in server:
                doc["comparison"].append(_against_hf(dataset, level, server[level], hf))
        for level, app in _by_level(doc, dataset, "app").items():
            if level in server:
                doc["overhead"].append(_overhead(dataset, level, server[level], app))
