"""Summarise the rounds of scripts/gpu/gpu_tune.py: median (min-max) over rounds, and the keep-a-flag rule.

usage: python scripts/gpu/summarize_tuning.py OUT_DIR ROUNDS_DIR [ROUNDS_DIR ...] [--logs LOGS_DIR ...]
  Each ROUNDS_DIR holds what one device call brought back: rounds.jsonl and machine-CALL.json.
  --logs: unpacked logs-CALL.tar.gz folders; their engine logs replace the excerpts in the rounds.
  Writes OUT_DIR/results.json (every round's figures, the machines, the medians and verdicts) and
  OUT_DIR/summary.md. The reference configuration is `defaults` (vLLM's own defaults).

The rule (the issue's "a flag stays only where it beats the defaults by more than the spread"): a
configuration beats the reference at a figure when its worst round is better than the reference's best
round AND its median is better by more than the larger of the two min-max spreads.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from backend.benchmarks.stats import spread

REFERENCE = "defaults"
# figure: (label, path in a level record, higher is better, decimals)
FIGURES: dict[str, tuple[str, tuple[str, ...], bool, int]] = {
    "tok_s": ("output tok/s", ("output_tokens_per_s",), True, 0),
    "ttft_p50": ("TTFT P50 ms", ("ttft_ms", "p50"), False, 1),
    "ttft_p99": ("TTFT P99 ms", ("ttft_ms", "p99"), False, 1),
    "tpot_p50": ("TPOT P50 ms", ("tpot_ms", "p50"), False, 2),
}
# Where the time to the first token goes (vLLM's histograms over the level: means per request).
PHASES: dict[str, tuple[str, str]] = {
    "client_ttft_mean": ("TTFT at the client (mean)", ""),
    "server_ttft_mean": ("vLLM TTFT: arrival in the API server to first token", "time_to_first_token_seconds"),
    "queue_mean": ("queue: waiting in the engine's scheduler", "request_queue_time_seconds"),
    "prefill_mean": ("prefill: first scheduled to first token", "request_prefill_time_seconds"),
}


def dig(record: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = record
    for key in path:
        value = value[key]
    return float(value)


def figure(values: list[float]) -> dict[str, float]:
    """{median, min, max, n} over the rounds."""
    return {**spread(values).to_dict(), "n": len(values)}


def verdict(ref: dict[str, float], other: dict[str, float], higher: bool) -> str:
    sign = 1 if higher else -1
    gain = sign * (other["median"] - ref["median"])
    width = max(ref["max"] - ref["min"], other["max"] - other["min"])
    apart = other["min"] > ref["max"] if higher else other["max"] < ref["min"]
    apart_worse = other["max"] < ref["min"] if higher else other["min"] > ref["max"]
    if apart and gain > width:
        return "better"
    if apart_worse and -gain > width:
        return "worse"
    return "within spread"


def fmt(s: dict[str, float], decimals: int) -> str:
    f = f"{{:,.{decimals}f}}"
    return f"{f.format(s['median'])} ({f.format(s['min'])}-{f.format(s['max'])})"


def bucket_p99_ms(buckets: dict[str, float], count: float) -> str:
    """The upper edge of the histogram bucket that holds the 99th percentile ('<= X ms')."""
    target = 0.99 * count
    for le, cum in sorted(((float(k), v) for k, v in buckets.items()), key=lambda kv: kv[0]):
        if cum >= target:
            return "inf" if le == float("inf") else f"{le * 1000:g}"
    return "?"


def load(dirs: list[Path], logs: list[Path]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rounds: list[dict[str, Any]] = []
    machines: dict[str, Any] = {}
    for d in dirs:
        rounds += [json.loads(line) for line in (d / "rounds.jsonl").read_text().splitlines() if line.strip()]
        for m in d.glob("machine-*.json"):
            info = json.loads(m.read_text())
            machines[info["call"]] = info
    if logs:
        from gpu_tune import log_excerpt

        for r in rounds:
            for folder in logs:
                log = folder / f"{r['call']}-{r['index']:02d}-{r['config']}" / "logs" / "engine.log"
                if log.exists() and "levels" in r:
                    r["engine_log"] = log_excerpt(log)
    return rounds, machines


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in rounds if "levels" in r]
    configs = sorted({r["config"] for r in done}, key=lambda c: (c != REFERENCE, c))
    levels = sorted({int(k) for r in done for k in r["levels"]})
    table: dict[str, Any] = {}
    for c in configs:
        mine = [r for r in done if r["config"] == c]
        table[c] = {}
        for lv in levels:
            recs = [r["levels"][str(lv)] for r in mine if str(lv) in r["levels"]]
            row = {key: figure([dig(x, path) for x in recs]) for key, (_, path, _, _) in FIGURES.items()}
            row["rounds"] = len(recs)
            row["errors"] = sum(x["errors"] for x in recs)
            row["client_cpu_s"] = figure([x["client_cpu_s"] for x in recs])
            phases = {"client_ttft_mean": figure([x["ttft_ms"]["mean"] for x in recs])}
            for key, (_, metric) in PHASES.items():
                values = [x["phases"][metric]["mean_ms"] for x in recs if metric and metric in x.get("phases", {})]
                if values:
                    phases[key] = figure(values)
            row["phases"] = phases
            table[c][str(lv)] = row
    verdicts: dict[str, Any] = {}
    for c in configs[1:]:
        verdicts[c] = {}
        for lv in levels:
            ref, mine = table[REFERENCE][str(lv)], table[c][str(lv)]
            verdicts[c][str(lv)] = {
                key: {
                    "ratio_of_medians": round(mine[key]["median"] / ref[key]["median"], 3),
                    "verdict": verdict(ref[key], mine[key], higher),
                }
                for key, (_, _, higher, _) in FIGURES.items()
            }
    return {"configs": configs, "levels": levels, "table": table, "verdicts": verdicts}


def markdown(rounds: list[dict[str, Any]], machines: dict[str, Any], s: dict[str, Any]) -> str:
    done = [r for r in rounds if "levels" in r]
    m = next(iter(machines.values()), {})
    others = [f"`{c}`" for c in s["configs"] if c != REFERENCE]
    out = [
        f"# ERNIE-4.5-0.3B on one NVIDIA H200: vLLM defaults against {', '.join(others)}, one engine at a time",
        "",
        f"GPU {m.get('gpu', '?')} (name, driver, memory, max SM clock); vLLM {m.get('vllm', '?')}, torch "
        f"{m.get('torch', '?')} (CUDA {m.get('torch_cuda', '?')}), Python {m.get('python', '?')}, "
        f"{m.get('cpus', '?')} CPUs ({m.get('cpu_model', '?')}). Calls: "
        + ", ".join(f"{k} started {v['started']}" for k, v in sorted(machines.items()))
        + ".",
        "",
        f"{m.get('input_len', '?')}-token prompts, {m.get('output_len', '?')} output tokens (`ignore_eos`), greedy; "
        "requests per level (users: requests): "
        + ", ".join(f"{u}: {n}" for u, n in m.get("levels", []))
        + ". Each round is one engine start through the project's supervisor, alone on the GPU (nothing on "
        "it before the start; one `VLLM::EngineCore` process while measured), a warm-up (16 and 64 "
        "full-length prompts with 32-token replies, which also takes vLLM's one Triton JIT compile of "
        "`kernel_unified_attention`), the levels through the project's benchmark tool, and a stop. "
        "Rounds alternate the configurations. Every figure below is the median over rounds with the "
        "min-max in brackets.",
        "",
        "| configuration | users | rounds | output tok/s | TTFT P50 ms | TTFT P99 ms | TPOT P50 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in s["configs"]:
        for lv in s["levels"]:
            row = s["table"][c][str(lv)]
            cells = [fmt(row[k], FIGURES[k][3]) for k in FIGURES]
            out.append(f"| {c} | {lv} | {row['rounds']} | " + " | ".join(cells) + " |")
    for c, per_level in s["verdicts"].items():
        out += [
            "",
            f"`{c}` against `{REFERENCE}` (ratio of medians; the verdict by the rule in "
            "scripts/gpu/summarize_tuning.py: better only when its worst round beats the best reference round "
            "and the medians differ by more than the larger spread):",
            "",
            "| users | " + " | ".join(FIGURES[k][0] for k in FIGURES) + " |",
            "|---|" + "---|" * len(FIGURES),
        ]
        for lv, figs in per_level.items():
            out.append(
                f"| {lv} | " + " | ".join(f"{v['ratio_of_medians']:.2f}× {v['verdict']}" for v in figs.values()) + " |"
            )
    out += [
        "",
        "## Every round",
        "",
        "| call | # | configuration | start s | tok/s 1 / 16 / 64 users | TTFT P99 ms 1 / 16 / 64 | "
        "TPOT P50 ms 1 / 16 / 64 | client CPU s at 64 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rounds:
        if "levels" not in r:
            if "skipped" not in r:
                out.append(f"| {r['call']} | {r['index']} | {r['config']} | failed: {r.get('error', '?')[:80]} |||||")
            continue
        lv = [r["levels"][str(u)] for u in s["levels"]]
        out.append(
            f"| {r['call']} | {r['index']} | {r['config']} | {r['start_s']:.0f} | "
            + " / ".join(f"{x['output_tokens_per_s']:,.0f}" for x in lv)
            + " | "
            + " / ".join(f"{x['ttft_ms']['p99']:.0f}" for x in lv)
            + " | "
            + " / ".join(f"{x['tpot_ms']['p50']:.2f}" for x in lv)
            + f" | {lv[-1]['client_cpu_s']:.1f} |"
        )
    skipped = [f"{r['call']} #{r['index']} {r['config']} ({r['skipped']})" for r in rounds if "skipped" in r]
    if skipped:
        out += ["", "Not started, for the call's time limit: " + ", ".join(skipped) + "."]
    out += [
        "",
        "Client CPU: the benchmark process's CPU seconds over the 64-user level's whole call (its 256 prompts "
        "built through /tokenize first, then measured over 4-5 s). With vLLM's default stream interval of one "
        "token the client parses eight times the chunks of `--stream-interval 8`; at 64 users that is ~2.5 s "
        "more CPU, so one Python client is near one core there and the defaults' 64-user throughput is a lower "
        "bound of the server's.",
    ]
    out += [
        "",
        "## Where the time to the first token goes at 16 users",
        "",
        "Means per request over each level (vLLM's histograms in /metrics, read before and after the level), "
        "median (min-max) over rounds, ms. The bucket column is the upper edge of vLLM's TTFT histogram bucket "
        "that holds the 99th percentile (its buckets are 10/20/40/60/80/100/250 ms). vLLM 0.26 stamps a chat "
        "request's arrival when the API server starts rendering it (vllm/renderers/base.py `render_chat`), so its "
        "TTFT holds the chat template, tokenization, the hand-off to the engine core process, the queue, the "
        "prefill (first scheduled to first token) and the way back; the client's TTFT adds the HTTP request's "
        "parsing before that and the first chunk's way out.",
        "",
        "| configuration | client TTFT mean | client TTFT P99 | vLLM TTFT mean | vLLM TTFT P99 bucket | queue mean | "
        "prefill mean | outside vLLM's TTFT (client − vLLM) | in vLLM's TTFT, outside queue and prefill |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in s["configs"]:
        recs = [r["levels"]["16"] for r in done if r["config"] == c and "16" in r["levels"]]
        if not recs or "time_to_first_token_seconds" not in recs[0].get("phases", {}):
            continue
        ph = [x["phases"] for x in recs]
        client = figure([x["ttft_ms"]["mean"] for x in recs])
        p99 = figure([x["ttft_ms"]["p99"] for x in recs])
        server = figure([p["time_to_first_token_seconds"]["mean_ms"] for p in ph])
        queue = figure([p["request_queue_time_seconds"]["mean_ms"] for p in ph])
        prefill = figure([p["request_prefill_time_seconds"]["mean_ms"] for p in ph])
        front = figure(
            [x["ttft_ms"]["mean"] - p["time_to_first_token_seconds"]["mean_ms"] for x, p in zip(recs, ph, strict=True)]
        )
        hand = figure(
            [
                p["time_to_first_token_seconds"]["mean_ms"]
                - p["request_queue_time_seconds"]["mean_ms"]
                - p["request_prefill_time_seconds"]["mean_ms"]
                for p in ph
            ]
        )
        buckets = "/".join(
            bucket_p99_ms(p["time_to_first_token_seconds"]["buckets"], p["time_to_first_token_seconds"]["count"])
            for p in ph
        )
        out.append(
            f"| {c} | {fmt(client, 1)} | {fmt(p99, 1)} | {fmt(server, 1)} | ≤ {buckets} | {fmt(queue, 2)} | "
            f"{fmt(prefill, 1)} | {fmt(front, 1)} | {fmt(hand, 1)} |"
        )
    out += ["", "## What each engine ran with (its log, first round of each configuration)", ""]
    for c in s["configs"]:
        r = next(r for r in done if r["config"] == c)
        out.append(f"`{c}`: `{' '.join(r['argv'][2:])}`")
        out.append("")
        shown: list[str] = []
        for line in r.get("engine_log", []):
            text = line.split("] ", 1)[-1]
            if any(k in line for k in ("non-default args", "Asynchronous scheduling", "Chunked prefill", "Using max")):
                shown.append(text[:600])
            elif "Initializing a V1 LLM engine" in line:
                mode = re.search(r"CUDAGraphMode\.(\w+)", line)
                size = re.search(r"'max_cudagraph_capture_size': (\d+)", line)
                shown.append(
                    f"engine config: cudagraph_mode {mode.group(1) if mode else '?'}, max_cudagraph_capture_size "
                    f"{size.group(1) if size else '?'}, enable_prefix_caching "
                    f"{'True' if 'enable_prefix_caching=True' in line else '?'}"
                )
            elif any(k in line for k in ("Available KV cache", "Graph capturing finished", "init engine")):
                shown.append(text[:200])
        out += [f"    {t}" for t in dict.fromkeys(shown)]
        out.append("")
    return "\n".join(out) + "\n"


def main(out: Path, dirs: list[Path], logs: list[Path]) -> None:
    rounds, machines = load(dirs, logs)
    s = summarize(rounds)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"machines": machines, "reference": REFERENCE, "summary": s, "rounds": rounds}
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    text = markdown(rounds, machines, s)
    (out / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="where results.json and summary.md go")
    parser.add_argument("rounds", type=Path, nargs="+", metavar="ROUNDS_DIR", help="one device call's rounds")
    parser.add_argument("--logs", type=Path, nargs="+", default=[], metavar="LOGS_DIR", help="unpacked engine logs")
    args = parser.parse_args()
    main(args.out, args.rounds, args.logs)
