"""Benchmark results as files: results.json, a Markdown report and PNG plots against concurrency.

The input is the run document benchmark.py builds (plain JSON data): "runs" hold per-level metrics for
each dataset and target ("server": plain HTTP to the engine, "app": the app's client path, "hf": HF
transformers), each figure the median over the rounds with its range in "spread" and the rounds themselves
in "per_round"; "comparison" the server/HF ratios and "overhead" the app's added latency, each claimed only
beyond the spread; "chat" the levels of the chat workload (--workload chat), one record per number of users.
The tables show "median (min-max)"; the plots draw the range as error bars.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from backend.benchmarks.comparison import compare
from backend.benchmarks.stats import Spread, level_spread

LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2EL"))
TARGET_NAMES = {"server": "server (HTTP)", "app": "app client", "hf": "HF transformers"}
# The main table's figures: (column, key, percentile or None, digits)
FIGURES = (
    ("out tok/s", "output_tokens_per_s", None, 1),
    ("req/s", "requests_per_s", None, 2),
    ("TTFT P50", "ttft_ms", "p50", 0),
    ("TTFT P99", "ttft_ms", "p99", 0),
    ("TPOT P50", "tpot_ms", "p50", 1),
    ("ITL P50", "itl_ms", "p50", 1),
    ("E2EL P50", "e2el_ms", "p50", 0),
)


# The chat workload's table: (column, key, part, digits)
CHAT_FIGURES = (
    ("output tok/s", "output_tok_s", None, 1),
    ("first text P50", "first_text_ms", "p50", 0),
    ("first text P90", "first_text_ms", "p90", 0),
    ("first text P99", "first_text_ms", "p99", 0),
    ("decode tok/s per reply P50", "decode_tok_s", "p50", 1),
    ("TPOT P50", "tpot_ms", "p50", 1),
    ("history cached", "history_cached", None, 2),
)
CHAT_DEFINITIONS = (
    '"First text" is the time from sending a turn to the first streamed chunk carrying text (what the user first '
    "sees), in ms; decode tok/s is per reply, (output tokens − 1) / (last chunk − first chunk), what one user "
    "sees; TPOT is its inverse in ms; output tok/s is every output token of the level over its wall time; "
    "history cached is the share of later turns' prompt tokens the server took from its prefix cache (where it "
    "says: llama-server does)."
)


TPOT = ("TPOT P50 server / HF", "TPOT")
DODGE = 0.06  # of an octave: how far apart the targets' points stand at one level


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _ranged(spread: Spread | None, digits: int = 1, unit: str = "", scale: float = 1.0) -> str:
    """'median (min-max)', or the median alone for one round; values divided by `scale`."""
    if spread is None:
        return "–"
    text = _num(spread.median / scale, digits)
    if spread.rounds > 1:
        text += f" ({_num(spread.low / scale, digits)}-{_num(spread.high / scale, digits)})"
    return text + unit


def _stored(figure: dict[str, float] | None, digits: int = 1) -> str:
    """_ranged for a figure stored as {median, min, max, rounds} (doc["comparison"], doc["overhead"])."""
    if not figure:
        return "–"
    return _ranged(Spread(figure["median"], figure["min"], figure["max"], int(figure["rounds"])), digits)


def _percentiles(summary: dict[str, float] | None) -> str:
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


def _level_row(target: str, lv: dict[str, Any]) -> list[str]:
    memory = _ranged(level_spread(lv, "peak_memory_bytes"), 0, " MiB", scale=2**20)
    if lv.get("memory_source") and memory != "–":
        memory += f" ({lv['memory_source']})"
    return [
        TARGET_NAMES.get(target, target),
        str(lv["concurrency"]),
        f"{_num(lv['requests'], 0)} × {lv.get('rounds', 1)}",
        str(lv["errors"]),
        _num(lv["mean_prompt_tokens"], 0),
        *(_ranged(level_spread(lv, key, part), digits) for _, key, part, digits in FIGURES),
        memory,
    ]


def _chat_section(chat: dict[str, Any]) -> list[str]:
    """The chat workload: what the conversations were, then one row per number of users."""
    shape = chat["shape"]
    (message_low, message_high), (reply_low, reply_high) = shape["message_tokens"], shape["reply_tokens"]
    lines = [
        "",
        "## Workload: chat",
        "",
        f"Conversations of {shape['turns']} turns, each turn sending the whole history (a system line, the earlier "
        f"turns with the text received) and a new user message of about {message_low}-{message_high} tokens; "
        f"replies of {reply_low}-{reply_high} tokens (exact: ignore_eos), lengths drawn from seed {shape['seed']}. "
        "The users start at once, each holding whole conversations one after the other."
        + (
            f" Conversation i is sent to llama-server's slot i % {shape['pin_slots']} (id_slot)."
            if shape.get("pin_slots")
            else ""
        ),
        "",
        CHAT_DEFINITIONS,
        "",
    ]
    header = ["users", "turns × rounds", "errors", "prompt tok mean / max", *(f[0] for f in CHAT_FIGURES)]

    def row(lv: dict[str, Any]) -> list[str]:
        prompts = lv.get("prompt_tokens") or {}
        return [
            str(lv["users"]),
            f"{lv['turns']} × {lv.get('rounds', 1)}",
            str(lv["errors"]),
            f"{_num(prompts.get('mean'), 0)} / {_num(prompts.get('max'), 0)}",
            *(_ranged(level_spread(lv, key, part), digits) for _, key, part, digits in CHAT_FIGURES),
        ]

    return lines + _table(header, (row(lv) for lv in chat["levels"]))


def markdown(doc: dict[str, Any]) -> str:
    """The report as Markdown: settings, tables per dataset, the HF comparison, the app overhead."""
    server, machine, settings = doc["server"], doc["machine"], doc["settings"]
    repeat = settings.get("repeat", 1)
    lines = [
        f"# Benchmark {doc['name']}",
        "",
        f"- Date: {doc['created']}; command: `{doc['command']}`",
        f"- Server: {server.get('engine', '?')} {server.get('version') or ''} ({server['kind']}) at "
        f"{server['base_url']}, model `{server['model']}`"
        + (f", flags `{server['flags']}`" if server.get("flags") else ""),
        f"- Machine: {machine['cpus']} CPUs; load average {machine['load_start']} at start, "
        f"{machine['load_end']} at end (other work on the machine distorts the figures)",
        f"- Sampling: temperature {settings['temperature']}, "
        + (f"top_p {settings['top_p']}, " if "top_p" in settings else "")
        + f"ignore_eos {settings['ignore_eos']}; requests per level and round: {settings['requests_rule']}",
        f"- Rounds: {repeat}, alternated (each round measures every dataset, level and target once); every "
        "figure is the median over the rounds with its range as (min-max); errors are counted over all rounds.",
    ]
    if not doc.get("chat"):
        lines.append(
            "- Latencies in ms; definitions of `vllm bench serve` "
            "(TPOT = (E2EL − TTFT) / (output tokens − 1); ITL = gap between streamed chunks)."
        )
    if doc.get("baseline"):
        base = doc["baseline"]
        lines.append(
            f"- HF baseline: transformers `generate`, {base['weights']} weights, {base['dtype']}, "
            f"cache {base['cache']}, {base['torch_threads']} torch threads, batch = concurrency "
            f"(each batch timed from its start)"
        )
    for note in doc.get("notes", []):
        lines.append(f"- Note: {note}")
    header = ["target", "conc.", "req. × rounds", "errors", "prompt tok", *(f[0] for f in FIGURES), "peak memory"]
    for dataset in datasets(doc):
        lines += ["", f"## Dataset: {dataset}", ""]
        if doc.get("datasets", {}).get(dataset):
            lines += [doc["datasets"][dataset], ""]
        measured = [(r["target"], lv) for r in doc["runs"] if r["dataset"] == dataset for lv in r["levels"]]
        lines += _table(header, (_level_row(target, lv) for target, lv in measured))
        lines += ["", "Latency percentiles (ms, median over the rounds): mean / P50 / P90 / P99", ""]
        lines += _table(
            ["target", "conc.", "TTFT", "TPOT", "ITL", "E2EL"],
            (
                [TARGET_NAMES.get(target, target), str(lv["concurrency"])]
                + [_percentiles(lv.get(key)) for key, _ in LATENCIES]
                for target, lv in measured
            ),
        )
    if doc.get("chat"):
        lines += _chat_section(doc["chat"])
    if doc.get("comparison"):
        lines += [
            "",
            "## Server against HF transformers",
            "",
            "Ratios of the medians, claimed only where the two ranges do not overlap.",
            "",
        ]
        lines += _table(
            ["dataset", "conc.", "server tok/s", "HF tok/s", "throughput", "TTFT P50 server / HF", "TTFT", *TPOT],
            (
                [
                    c["dataset"],
                    str(c["concurrency"]),
                    _stored(c["server_tok_s"]),
                    _stored(c["hf_tok_s"]),
                    c["tok_s_claim"],
                    f"{_stored(c['server_ttft'], 0)} / {_stored(c['hf_ttft'], 0)} ms",
                    c["ttft_claim"],
                    f"{_stored(c['server_tpot'])} / {_stored(c['hf_tpot'])} ms",
                    c["tpot_claim"],
                ]
                for c in doc["comparison"]
            ),
        )
    if doc.get("overhead"):
        lines += [
            "",
            "## App overhead (the app's client path against plain HTTP, same prompts)",
            "",
            "Time to the first visible text (first chunk with text), P50; output tokens/s of the level. "
            "A difference is claimed only where the two ranges do not overlap.",
            "",
        ]
        lines += _table(
            ["dataset", "conc.", "first text P50 raw / app", "added", "tok/s raw / app", "tok/s loss"],
            (
                [
                    o["dataset"],
                    str(o["concurrency"]),
                    f"{_stored(o['raw_first_text_p50_ms'])} / {_stored(o['app_first_text_p50_ms'])} ms",
                    o["added_ttft_claim"],
                    f"{_stored(o['raw_tok_s'])} / {_stored(o['app_tok_s'])}",
                    o["tok_s_loss_claim"],
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


def _errorbar(ax: Any, levels: list[dict[str, Any]], key: str, part: str | None, index: int = 0, **style: Any) -> None:
    """The medians over the rounds against concurrency, each with its min-max range as an error bar; the
    `index`-th target's points a little to the right (on the log axis), so that the bars of targets do not hide
    each other."""
    points = [(lv["concurrency"], s) for lv in levels if (s := level_spread(lv, key, part)) is not None]
    if not points:
        return
    xs = [x * 2 ** (DODGE * index) for x, _ in points]
    ys = [s.median for _, s in points]
    bars = [[s.median - s.low for _, s in points], [s.high - s.median for _, s in points]]
    ax.errorbar(xs, ys, yerr=bars, marker="o", capsize=3, **style)


def plot_latency(doc: dict[str, Any], dataset: str, path: Path) -> None:
    """TTFT, TPOT, ITL and E2EL percentiles (P50 solid, P90 dashed, P99 dotted) against concurrency:
    medians over the rounds, the range as error bars."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 8), layout="constrained")
    axes = fig.subplots(2, 2)
    for ax, (key, title) in zip(axes.flat, LATENCIES, strict=True):
        for index, (target, levels) in enumerate(_series(doc, dataset)):
            for pct, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
                label = TARGET_NAMES.get(target, target) if pct == "p50" else None
                _errorbar(ax, levels, key, pct, index, linestyle=style, color=f"C{index}", label=label)
        ax.set_title(f"{title} (ms)")
        _concurrency_axis(ax, doc)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(
        f"{doc['name']}: latency, dataset {dataset} (P50 solid, P90 dashed, P99 dotted; "
        "median over rounds, bars min-max)"
    )
    fig.savefig(path, dpi=100)


def plot_throughput(doc: dict[str, Any], dataset: str, path: Path) -> None:
    """Output tokens/s and requests/s against concurrency, one line per target, the range as error bars."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5), layout="constrained")
    tokens_ax, requests_ax = fig.subplots(1, 2)
    for index, (target, levels) in enumerate(_series(doc, dataset)):
        name = TARGET_NAMES.get(target, target)
        _errorbar(tokens_ax, levels, "output_tokens_per_s", None, index, color=f"C{index}", label=name)
        _errorbar(requests_ax, levels, "requests_per_s", None, index, color=f"C{index}", label=name)
    for ax, title in ((tokens_ax, "output tokens/s"), (requests_ax, "requests/s")):
        ax.set_title(title)
        _concurrency_axis(ax, doc)
        ax.legend(fontsize=8)
    fig.suptitle(f"{doc['name']}: throughput, dataset {dataset} (median over rounds, bars min-max)")
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
    doc = json.loads(results_file.read_text(encoding="utf-8"))
    compare(doc)  # again: results written before rounds hold comparisons of another shape
    for written in write_report(doc, results_file.parent):
        print(written)
    return 0
