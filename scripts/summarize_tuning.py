"""Summarise several benchmark results (one folder each) into one Markdown table and one JSON file.

usage: python scripts/summarize_tuning.py RESULTS_DIR   (reads RESULTS_DIR/*/results.json)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def row(doc: dict) -> dict:
    out = {"experiment": doc["name"], "flags": doc["server"].get("experiment", {}), "levels": {}}
    for run in doc["runs"]:
        for lv in run["levels"]:
            key = f"{run['target']}@{lv['concurrency']}"
            out["levels"][key] = {
                "tok_s": round(lv["output_tokens_per_s"], 1),
                "ttft_p50_ms": round(lv["ttft_ms"]["p50"], 1),
                "ttft_p99_ms": round(lv["ttft_ms"]["p99"], 1),
                "tpot_p50_ms": round(lv["tpot_ms"]["p50"], 2),
            }
    return out


def main(folder: Path) -> None:
    rows = [row(json.loads(p.read_text())) for p in sorted(folder.glob("*/results.json"))]
    (folder / "summary.json").write_text(json.dumps(rows, indent=2))
    lines = [
        "| experiment | extra flags | tok/s c=1 | TPOT P50 c=1 (ms) | tok/s c=16 | TTFT P99 c=16 (ms) "
        "| tok/s c=64 | TTFT P99 c=64 (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lv = r["levels"]
        args, kept = r["flags"].get("extra_args", []), []
        skip = {"--attention-backend", "--kv-cache-memory-bytes"}  # the same in every experiment
        for i, a in enumerate(args):
            if a not in skip and (i == 0 or args[i - 1] not in skip):
                kept.append(a)
        extra = " ".join(kept) or "-"
        profile = r["flags"].get("profile", "?")
        one = lv["server@1"]
        lines.append(
            f"| {r['experiment']} | profile {profile}; {extra} | {one['tok_s']:,.0f} | {one['tpot_p50_ms']} "
            f"| {lv['server@16']['tok_s']:,.0f} | {lv['server@16']['ttft_p99_ms']} | {lv['server@64']['tok_s']:,.0f} "
            f"| {lv['server@64']['ttft_p99_ms']} |"
        )
    (folder / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
