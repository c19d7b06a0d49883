"""Benchmark results as files: results.json, a Markdown report and PNG plots against concurrency.

The input is the run document benchmark.py builds (plain JSON data): "runs" hold per-level metrics for
each dataset and target ("server": plain HTTP to the engine, "app": the app's client path, "hf": HF
transformers), "comparison" the server/HF ratios and "overhead" the app's added latency.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2EL"))
TARGET_NAMES = {"server": "server (HTTP)", "app": "app client", "hf": "HF transformers"}


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _mib(value: float | None) -> str:
    return "–" if value is None else f"{value / 2**20:,.0f} MiB"


def _spread(summary: dict[str, float] | None) -> str:
    if not summary:
        return "–"
    return " / ".join(_num(summary[key], 0 if summary[key] >= 100 else 1) for key in ("mean", "p50", "p90", "p99"))


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def datasets(doc: dict[str, Any]) -> list[str]:
    """The datasets of the run, in the order they ran."""
    return list(dict.fromkeys(run["dataset"] for run in doc["runs"]))


def markdown(doc: dict[str, Any]) -> str:
    """The report as Markdown: settings, one table per dataset, the HF comparison, the app overhead."""
    server, machine, settings = doc["server"], doc["machine"], doc["settings"]
    lines = [
        f"# Benchmark {doc['name']}",
        "",
        f"- Date: {doc['created']}; command: `{doc['command']}`",
        f"- Server: {server.get('engine', '?')} {server.get('version') or ''} ({server['kind']}) at "
        f"{server['base_url']}, model `{server['model']}`"
        + (f", flags `{server['flags']}`" if server.get("flags") else ""),
        f"- Machine: {machine['cpus']} CPUs; load average {machine['load_start']} at start, "
        f"{machine['load_end']} at end (other work on the machine distorts the figures)",
        f"- Sampling: temperature {settings['temperature']}, top_p {settings['top_p']}, "
        f"ignore_eos {settings['ignore_eos']}; requests per level: {settings['requests_rule']}",
        "- Latencies in ms as mean / P50 / P90 / P99; definitions of `vllm bench serve` "
        "(TPOT = (E2EL − TTFT) / (output tokens − 1); ITL = gap between streamed chunks).",
    ]
    if doc.get("baseline"):
        base = doc["baseline"]
        lines.append(
            f"- HF baseline: transformers `generate`, {base['weights']} weights, {base['dtype']}, "
            f"cache {base['cache']}, {base['torch_threads']} torch threads, batch = concurrency "
            f"(each batch timed from its start)"
        )
    for note in doc.get("notes", []):
        lines.append(f"- Note: {note}")
    header = ["target", "conc.", "req.", "errors", "prompt tok", "out tok", "TTFT", "TPOT", "ITL", "E2EL"]
    header += ["out tok/s", "req/s", "peak memory"]
    for dataset in datasets(doc):
        lines += ["", f"## Dataset: {dataset}", ""]
        if doc.get("datasets", {}).get(dataset):
            lines += [doc["datasets"][dataset], ""]
        rows = []
        for run in (r for r in doc["runs"] if r["dataset"] == dataset):
            for lv in run["levels"]:
                rows.append(
                    [
                        TARGET_NAMES.get(run["target"], run["target"]),
                        str(lv["concurrency"]),
                        str(lv["requests"]),
                        str(lv["errors"]),
                        _num(lv["mean_prompt_tokens"], 0),
                        str(lv["total_output_tokens"]),
                        _spread(lv["ttft_ms"]),
                        _spread(lv["tpot_ms"]),
                        _spread(lv["itl_ms"]),
                        _spread(lv["e2el_ms"]),
                        _num(lv["output_tokens_per_s"]),
                        _num(lv["requests_per_s"], 2),
                        _mib(lv.get("peak_memory_bytes"))
                        + (f" ({lv['memory_source']})" if lv.get("memory_source") else ""),
                    ]
                )
        lines += _table(header, rows)
    if doc.get("comparison"):
        lines += ["", "## Server against HF transformers", ""]
        lines += _table(
            [
                "dataset",
                "conc.",
                "server tok/s",
                "HF tok/s",
                "throughput ×",
                "TTFT P50 server / HF",
                "TPOT P50 server / HF",
            ],
            (
                [
                    c["dataset"],
                    str(c["concurrency"]),
                    _num(c["server_tok_s"]),
                    _num(c["hf_tok_s"]),
                    _num(c["throughput_ratio"], 2),
                    f"{_num(c['server_ttft_p50_ms'], 0)} / {_num(c['hf_ttft_p50_ms'], 0)} ms",
                    f"{_num(c['server_tpot_p50_ms'])} / {_num(c['hf_tpot_p50_ms'])} ms",
                ]
                for c in doc["comparison"]
            ),
        )
    if doc.get("overhead"):
        lines += [
            "",
            "## App overhead (the app's client path against plain HTTP, same prompts)",
            "",
            "Time to the first visible text (first chunk with text), P50 and mean; output tokens/s of the level.",
            "",
        ]
        lines += _table(
            [
                "dataset",
                "conc.",
                "first text P50 raw / app",
                "added P50",
                "added mean",
                "tok/s raw / app",
                "tok/s loss",
            ],
            (
                [
                    o["dataset"],
                    str(o["concurrency"]),
                    f"{_num(o['raw_first_text_p50_ms'])} / {_num(o['app_first_text_p50_ms'])} ms",
                    f"{_num(o['added_ttft_p50_ms'])} ms",
                    f"{_num(o['added_ttft_mean_ms'])} ms",
                    f"{_num(o['raw_tok_s'])} / {_num(o['app_tok_s'])}",
                    f"{_num(o['tok_s_loss_pct'])} %",
                ]
                for o in doc["overhead"]
            ),
        )
    return "\n".join(lines) + "\n"


def _series(doc: dict[str, Any], dataset: str) -> list[tuple[str, list[dict[str, Any]]]]:
    return [(r["target"], r["levels"]) for r in doc["runs"] if r["dataset"] == dataset and r["levels"]]


def _concurrency_axis(ax: Any, doc: dict[str, Any]) -> None:
    levels = sorted({lv["concurrency"] for run in doc["runs"] for lv in run["levels"]})
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(level) for level in levels])
    ax.minorticks_off()
    ax.set_xlabel("concurrent requests")
    ax.grid(True, alpha=0.3)


def plot_latency(doc: dict[str, Any], dataset: str, path: Path) -> None:
    """TTFT, TPOT, ITL and E2EL percentiles (P50 solid, P90 dashed, P99 dotted) against concurrency."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 8), layout="constrained")
    axes = fig.subplots(2, 2)
    for ax, (key, title) in zip(axes.flat, LATENCIES, strict=True):
        for index, (target, levels) in enumerate(_series(doc, dataset)):
            color = f"C{index}"
            for pct, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
                points = [(lv["concurrency"], lv[key][pct]) for lv in levels if lv.get(key)]
                if points:
                    xs, ys = zip(*points, strict=True)
                    label = TARGET_NAMES.get(target, target) if pct == "p50" else None
                    ax.plot(xs, ys, style, marker="o", color=color, label=label)
        ax.set_title(f"{title} (ms)")
        _concurrency_axis(ax, doc)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"{doc['name']}: latency, dataset {dataset} (P50 solid, P90 dashed, P99 dotted)")
    fig.savefig(path, dpi=100)


def plot_throughput(doc: dict[str, Any], dataset: str, path: Path) -> None:
    """Output tokens/s and requests/s against concurrency, one line per target."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5), layout="constrained")
    tokens_ax, requests_ax = fig.subplots(1, 2)
    for index, (target, levels) in enumerate(_series(doc, dataset)):
        xs = [lv["concurrency"] for lv in levels]
        name = TARGET_NAMES.get(target, target)
        tokens_ax.plot(xs, [lv["output_tokens_per_s"] for lv in levels], marker="o", color=f"C{index}", label=name)
        requests_ax.plot(xs, [lv["requests_per_s"] for lv in levels], marker="o", color=f"C{index}", label=name)
    for ax, title in ((tokens_ax, "output tokens/s"), (requests_ax, "requests/s")):
        ax.set_title(title)
        _concurrency_axis(ax, doc)
        ax.legend(fontsize=8)
    fig.suptitle(f"{doc['name']}: throughput, dataset {dataset}")
    fig.savefig(path, dpi=100)


def write_report(doc: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write results.json, report.md and two PNG plots per dataset into out_dir; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "results.json", out_dir / "report.md"]
    written[0].write_text(json.dumps(doc, indent=2, ensure_ascii=False), encoding="utf-8")
    written[1].write_text(markdown(doc), encoding="utf-8")
    if importlib.util.find_spec("matplotlib") is None:
        # e.g. on a GPU machine with no matplotlib: `python -m backend report results.json` draws them later
        return written
    for dataset in datasets(doc):
        for kind, draw in (("latency", plot_latency), ("throughput", plot_throughput)):
            path = out_dir / f"{dataset}_{kind}.png"
            draw(doc, dataset, path)
            written.append(path)
    return written


def report_command(results_file: Path) -> int:
    """`report`: rewrite report.md and the plots beside a results.json; print what was written."""
    for written in write_report(json.loads(results_file.read_text(encoding="utf-8")), results_file.parent):
        print(written)
    return 0
