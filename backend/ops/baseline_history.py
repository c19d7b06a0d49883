"""The daily baseline's history (<data_dir>/bench-history.jsonl, written by `bench --snapshot`) and what the
doctor reads from it: whether the newest snapshot is slower than the recent ones."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from backend.config import AppConfig

RECENT = 7  # the newest line is compared with the median of this many lines before it
REGRESSION = 0.15  # slower than that median by more than this share (and than every recent line) is a regression


def history_file(cfg: AppConfig) -> Path:
    return cfg.paths.data / "bench-history.jsonl"


def read_history(cfg: AppConfig) -> list[dict[str, Any]]:
    """Every line of the history that parses, oldest first."""
    try:
        text = history_file(cfg).read_text(encoding="utf-8")
    except OSError:
        return []
    lines = []
    for raw in text.splitlines():
        try:
            lines.append(json.loads(raw))
        except ValueError:
            continue
    return lines


def regression(history: list[dict[str, Any]], level: int = 1) -> str | None:
    """Why the newest line is a regression against the recent median at `level` users, or None."""

    def tok_s(line: dict[str, Any]) -> float | None:
        value = (line.get("levels") or {}).get(str(level), {}).get("tok_s")
        return float(value) if isinstance(value, int | float) else None

    if len(history) < 3:
        return None
    newest = tok_s(history[-1])
    recent = [v for v in (tok_s(line) for line in history[-RECENT - 1 : -1]) if v is not None]
    if newest is None or len(recent) < 2:
        return None
    median = statistics.median(recent)
    if newest < median * (1 - REGRESSION) and newest < min(recent):
        return (
            f"{newest:.1f} tok/s at {level} user(s) in the newest snapshot ({history[-1].get('time')}, commit "
            f"{history[-1].get('commit')}) against a median of {median:.1f} over the {len(recent)} before it"
        )
    return None
