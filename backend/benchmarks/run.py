"""`python -m backend bench`: latency and throughput of the chat backend at a sweep of concurrency levels.

By default the engine is started as the app starts it (ChatService from the configuration) and stopped
at the end; --base-url measures a server that already runs. Each level sends synthetic prompts of a
fixed token length and/or the shipped Chinese prompt set over plain streaming HTTP; chosen levels are
sent again through the app's own client path (overhead), and the same prompts go through HF
transformers `generate` in the engine's interpreter (baseline). With --workload chat, each level is
instead that many users holding conversations whose history grows (backend.benchmarks.chat_workload),
over plain HTTP only. Every level and target is measured in --repeat rounds, alternated
(backend.benchmarks.plan); each figure is reported as the median of the rounds with its min-max range,
each round's own figures kept. Results: results/<name>/.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm import tqdm

from backend.benchmarks.baseline import add_baseline, baseline_job, run_baseline
from backend.benchmarks.chat_workload import ChatShape, run_chat_level
from backend.benchmarks.comparison import compare
from backend.benchmarks.loadgen import AppSender, LevelRun, RawSender, Sampling, Sender, run_level
from backend.benchmarks.memory import PeakSampler
from backend.benchmarks.plan import MIN_REQUESTS, TARGETS, requests_per_level, requests_rule, schedule
from backend.benchmarks.redact import KEY_ENV, masked_command, scrub
from backend.benchmarks.report import write_report
from backend.benchmarks.spread import RawTarget, run_level_spread, shares
from backend.benchmarks.stats import combine_rounds, level_metrics
from backend.benchmarks.targets import MemoryReader, Server, external_server, managed_server, server_version
from backend.benchmarks.workload import (
    BenchRequest,
    PromptSetWorkload,
    SyntheticWorkload,
    Tagger,
    load_prompt_set,
)
from backend.chat.client import ChatClient
from backend.config import ROOT, AppConfig
from backend.errors import BenchmarkError, ServiceError

log = logging.getLogger(__name__)


def _levels(text: str) -> list[int]:
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise BenchmarkError(f"Concurrency levels {text!r} are not a list of positive integers.", "Use e.g. 1,2,4,8.")
    return values


def _token_range(text: str, option: str) -> tuple[int, int]:
    """'LOW-HIGH' (or one number N: N-N) as two integers."""
    try:
        parts = [int(part) for part in text.split("-")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2):
        raise BenchmarkError(f"{option} {text!r} is not a range of tokens.", f"Use LOW-HIGH, e.g. {option} 20-80.")
    return parts[0], parts[-1]


def _chat_shape(args: argparse.Namespace) -> ChatShape:
    message = _token_range(args.message_tokens, "--message-tokens")
    reply = _token_range(args.reply_tokens, "--reply-tokens")
    try:
        return ChatShape(
            turns=args.turns, message_tokens=message, reply_tokens=reply, seed=args.seed, pin_slots=args.pin_slots
        )
    except ValueError as exc:
        raise BenchmarkError(
            f"The chat workload's shape cannot be used: {exc}.",
            "Give --turns of at least 1, --message-tokens / --reply-tokens as LOW-HIGH with 1 <= LOW <= HIGH, "
            "and --pin-slots of 0 or more.",
        ) from exc


def chat_turns(level: int, per_user: int, fixed: int | None = None, turns_each: int = 1) -> int:
    """Turns one chat level holds in one round: as requests_per_level, but never fewer than MIN_REQUESTS, nor fewer
    than one whole conversation of `turns_each` turns per user (a user without a conversation sends nothing: 16 users
    holding 32 turns of 4-turn conversations would be 8 users at once)."""
    return max(MIN_REQUESTS, requests_per_level(level, per_user, fixed), level * turns_each)


def check_options(args: argparse.Namespace) -> argparse.Namespace:
    """Check the options of `bench` (backend.cli) and add what follows from them; raise BenchmarkError.

    Adds levels, dataset_names, app_levels and chat_shape (None unless --workload chat), and fills in name,
    out_dir and api_key (else $ERNIE_BENCH_API_KEY)."""
    args.levels = _levels(args.concurrency)
    args.dataset_names = [d.strip() for d in args.datasets.split(",") if d.strip()]
    unknown = set(args.dataset_names) - {"synthetic", "prompts"}
    if unknown or not args.dataset_names:
        raise BenchmarkError(f"Unknown dataset(s) in --datasets {args.datasets!r}.", "Use synthetic, prompts or both.")
    if args.app_concurrency == "none":
        args.app_levels = []
    elif args.app_concurrency == "ends":
        args.app_levels = sorted({args.levels[0], args.levels[-1]})
    else:
        args.app_levels = _levels(args.app_concurrency)
        if not set(args.app_levels) <= set(args.levels):
            raise BenchmarkError(
                "--app-concurrency must be among the --concurrency levels.",
                "Use ends, none, or levels listed in --concurrency.",
            )
    if args.rounds is not None:
        raise BenchmarkError(
            "--rounds is gone: it set the requests per level (rounds x concurrency), and a round now means "
            "one repetition of the whole sweep.",
            "Use --per-user N for N x concurrency requests per level (at least 32), --requests N for a fixed "
            "number, and --repeat N for the number of alternated rounds.",
        )
    for name in ("repeat", "per_user", "requests", "input_len", "output_len", "client_processes"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise BenchmarkError(f"--{name.replace('_', '-')} must be at least 1.", "Give a positive whole number.")
    args.chat_shape = None
    if args.workload == "chat":
        if args.no_ignore_eos:
            raise BenchmarkError(
                "--no-ignore-eos does not apply to --workload chat.",
                "Chat replies run to their drawn length (--reply-tokens): leave the flag out.",
            )
        args.chat_shape = _chat_shape(args)
        args.app_levels = []  # plain HTTP only: the app's client path measures single requests
        if args.client_processes > 1:
            raise BenchmarkError(
                "--client-processes applies to --workload requests only.",
                "Leave it out for the chat workload (one process holds its conversations).",
            )
    args.api_key = args.api_key or os.environ.get(KEY_ENV) or "EMPTY"
    args.name = args.name or time.strftime("bench-%Y%m%d-%H%M%S")
    args.out_dir = (args.out_dir or ROOT / "results" / args.name).resolve()
    return args


# ----- the sweep -----------------------------------------------------------------------------------
def _bar(args: argparse.Namespace, total: int, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, unit="req", disable=args.no_progress, leave=True, dynamic_ncols=True)


async def measure_level(
    args: argparse.Namespace,
    send: Sender,
    requests: list[BenchRequest],
    level: int,
    memory: MemoryReader,
    desc: str,
    spread: RawTarget | None = None,
) -> tuple[LevelRun, dict[str, Any]]:
    """Run one level with a progress bar and a memory sampler; return the run and its JSON record. With `spread`,
    the level is sent from --client-processes processes over plain HTTP instead (backend.benchmarks.spread)."""
    load_before = os.getloadavg()
    with _bar(args, len(requests), desc) as bar:
        async with PeakSampler(memory) as sampler:
            if spread is not None and args.client_processes > 1:
                results, duration = await run_level_spread(spread, requests, level, args.client_processes)
                bar.update(len(requests))
            else:
                results, duration = await run_level(send, requests, level, lambda: bar.update(1))
    metrics = level_metrics(level, results, duration)
    record = metrics.to_dict() | {
        "peak_memory_bytes": sampler.peak,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    ttft = metrics.ttft_ms.p50 if metrics.ttft_ms else None
    tqdm.write(
        f"{desc}: {metrics.output_tokens_per_s:.1f} out tok/s, {metrics.requests_per_s:.2f} req/s, "
        f"TTFT P50 {ttft if ttft is None else round(ttft)} ms, errors {metrics.errors}",
        file=sys.stderr,
    )
    for sample in metrics.error_samples:
        tqdm.write(f"  error: {sample}", file=sys.stderr)
    return LevelRun(requests, results, metrics), record


async def measure_chat_level(
    args: argparse.Namespace, server: Server, users: int, temperature: float, desc: str
) -> dict[str, Any]:
    """Hold one level of the chat workload with a memory sampler; return its JSON record."""
    ep = server.endpoint
    turns = chat_turns(users, args.per_user, args.requests, args.chat_shape.turns)
    load_before = os.getloadavg()
    async with PeakSampler(server.memory) as sampler:
        level = await run_chat_level(
            ep.base_url, ep.api_key, ep.model, users, turns, args.chat_shape, temperature, args.timeout
        )
    record = level.summary() | {
        "peak_memory_bytes": sampler.peak,
        "memory_source": server.memory_source,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    first_text, decode = record["first_text_ms"], record["decode_tok_s"]
    tqdm.write(
        f"{desc}: {record['output_tok_s']:.1f} out tok/s, first text P50 "
        f"{round(first_text['p50']) if first_text else None} ms, decode P50 "
        f"{round(decode['p50'], 1) if decode else None} tok/s per reply, errors {record['errors']}",
        file=sys.stderr,
    )
    for sample in record["error_samples"]:
        tqdm.write(f"  error: {sample}", file=sys.stderr)
    return record


def _warmup(tagger: Tagger, count: int) -> list[BenchRequest]:
    """Unmeasured requests: the server's first requests, and the app client's first connection, are slower."""
    return [BenchRequest([{"role": "user", "content": tagger.tag() + "你好"}], 16, "warmup")] * count


async def chat_sweep(args: argparse.Namespace, server: Server, sampling: Sampling, doc: dict[str, Any]) -> None:
    """Hold the chat workload at every level, the levels alternated round by round; fill doc['chat']."""
    shape: ChatShape = args.chat_shape
    ep = server.endpoint
    if args.warmup:
        raw = RawSender(ep.base_url, ep.api_key, ep.model, sampling, args.timeout)
        try:
            await run_level(raw, _warmup(Tagger(), args.warmup), 1)
        finally:
            await raw.aclose()
    rounds: dict[int, list[dict[str, Any]]] = {}
    order = 0
    for number in range(1, args.repeat + 1):
        for users in args.levels:
            order += 1
            desc = f"chat users={users} round {number}/{args.repeat}"
            record = await measure_chat_level(args, server, users, sampling.temperature, desc)
            rounds.setdefault(users, []).append({"round": number, "order": order} | record)
    doc["chat"] = {"shape": asdict(shape), "levels": [combine_rounds(rounds[users]) for users in args.levels]}


def _count_tokens(client: ChatClient) -> Callable[[list[dict[str, str]]], Awaitable[int | None]]:
    async def count(messages: list[dict[str, str]]) -> int | None:
        try:
            return await client.count_tokens(messages)
        except ServiceError:
            return None

    return count


async def sweep(
    args: argparse.Namespace, server: Server, sampling: Sampling, flush_s: float, doc: dict[str, Any]
) -> dict[str, dict[int, list[LevelRun]]]:
    """Run every dataset at every level over HTTP, and the chosen levels through the app's client, round by
    round (plan.schedule); fill doc['runs'] and return the server's runs, per dataset and level, one per round."""
    tagger = Tagger()
    workloads: dict[str, SyntheticWorkload | PromptSetWorkload] = {}
    for name in args.dataset_names:
        if name == "synthetic":
            count = _count_tokens(server.client)
            workloads["synthetic"] = SyntheticWorkload(args.input_len, args.output_len, tagger, count, args.seed)
            doc["datasets"]["synthetic"] = (
                f"random words, {args.input_len} prompt tokens each (chat template included), "
                f"{args.output_len} output tokens"
            )
        else:
            items = load_prompt_set(args.prompts)
            workloads[args.prompts.stem] = PromptSetWorkload(items, tagger, args.prompts_output_len)
            lengths = (
                f"{args.prompts_output_len} output tokens" if args.prompts_output_len else "output tokens per prompt"
            )
            kinds = ", ".join(sorted({i.category for i in items}))
            doc["datasets"][args.prompts.stem] = f"{len(items)} prompts from {args.prompts.name} ({kinds}), {lengths}"
    ep = server.endpoint
    raw = RawSender(ep.base_url, ep.api_key, ep.model, sampling, args.timeout, connections=max(args.levels) + 4)
    senders: dict[str, Sender] = {"server": raw, "app": AppSender(server.client, sampling, flush_s)}
    spread = RawTarget(ep.base_url, ep.api_key, ep.model, sampling, args.timeout)  # --client-processes
    rounds: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    done: dict[str, dict[int, list[LevelRun]]] = {dataset: {} for dataset in workloads}
    try:
        for send in senders.values() if args.warmup else ():
            await run_level(send, _warmup(tagger, args.warmup), 1)
        for order, m in enumerate(schedule(args.repeat, list(workloads), args.levels, args.app_levels), start=1):
            # The prompt set: the same prompts in every round and for both targets (new tags); synthetic: new
            # prompts of the same lengths.
            requests = await workloads[m.dataset].take(requests_per_level(m.level, args.per_user, args.requests))
            desc = f"{m.dataset} {m.target} c={m.level} round {m.round}/{args.repeat}"
            where_from = spread if m.target == "server" else None
            run, record = await measure_level(
                args, senders[m.target], requests, m.level, server.memory, desc, where_from
            )
            record["client_processes"] = len(shares(m.level, args.client_processes)) if where_from else 1
            where = {"round": m.round, "order": order}
            rounds.setdefault((m.dataset, m.target, m.level), []).append(
                where | record | {"memory_source": server.memory_source}
            )
            if m.target == "server":
                done[m.dataset].setdefault(m.level, []).append(run)
    finally:
        await raw.aclose()
    for dataset in workloads:
        for target in TARGETS:
            keys = [(dataset, target, level) for level in args.levels]
            if levels := [combine_rounds(rounds[key]) for key in keys if key in rounds]:
                doc["runs"].append({"dataset": dataset, "target": target, "levels": levels})
    return done


# ----- the command ---------------------------------------------------------------------------------
def _settings(args: argparse.Namespace, sampling: Sampling) -> dict[str, Any]:
    """The run's settings as recorded in results.json: those of the workload chosen."""
    common = {"workload": args.workload, "concurrency": args.levels, "repeat": args.repeat,
              "client_processes": args.client_processes}  # fmt: skip
    if args.chat_shape is not None:
        fixed = f"{max(MIN_REQUESTS, args.requests)} (fixed)" if args.requests else None
        turns = f"{fixed or f'max({MIN_REQUESTS}, {args.per_user} x users)'} turns in all"
        return common | {
            "requests_rule": turns,
            "chat": asdict(args.chat_shape),
            "temperature": sampling.temperature,
            "ignore_eos": True,
            "warmup": args.warmup,
        }
    return common | {
        "app_concurrency": args.app_levels,
        "requests_rule": requests_rule(args.per_user, args.requests),
        "datasets": args.dataset_names,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "prompts": str(args.prompts),
        "prompts_output_len": args.prompts_output_len,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "ignore_eos": sampling.ignore_eos,
        "warmup": args.warmup,
    }


async def run(cfg: AppConfig, args: argparse.Namespace, argv: list[str], python: str) -> dict[str, Any]:
    """Run the whole benchmark and return the run document (also written to args.out_dir).

    `args` are checked options (check_options), `argv` the command line as given (for the record),
    `python` the engine's interpreter (the HF baseline's, unless --hf-python)."""
    sampling = Sampling(
        temperature=cfg.chat.temperature if args.temperature is None else args.temperature,
        top_p=cfg.chat.top_p if args.top_p is None else args.top_p,
        ignore_eos=not args.no_ignore_eos,
    )
    doc: dict[str, Any] = {
        "name": args.name,
        "created": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "command": "python -m backend bench " + masked_command(argv),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_start": [round(x, 2) for x in os.getloadavg()],
        },
        "settings": _settings(args, sampling),
        "datasets": {},
        "runs": [],
        "baseline": None,
        "notes": [],
    }
    if args.base_url:
        server_cm = external_server(cfg, args.base_url, args.api_key, args.model)
        doc["notes"].append("Memory of an existing server is what its /metrics reports (vLLM: the API server only).")
    else:
        cfg.server.port = args.port
        cfg.paths.data_dir = str(args.out_dir / "engine")
        server_cm = managed_server(cfg)
    try:
        async with server_cm as server:
            doc["server"] = {
                "kind": server.kind,
                "engine": server.engine,
                "version": await server_version(server.endpoint),
                "base_url": server.endpoint.base_url,
                "model": server.endpoint.model,
                "model_path": server.model_path,
                "flags": server.flags,
            }
            if args.chat_shape is None:
                done = await sweep(args, server, sampling, cfg.chat.stream_flush_ms / 1000, doc)
            else:
                done = {}
                await chat_sweep(args, server, sampling, doc)
    finally:
        if not args.base_url:  # the managed engine is stopped and its key dead: no key file in the results folder
            cfg.paths.engine_state.with_suffix(".key").unlink(missing_ok=True)
    if args.app_levels:
        doc["notes"].append(
            f"App client ITL is the gap between the chat's paced updates (chat.stream_flush_ms = "
            f"{cfg.chat.stream_flush_ms:g} ms), not between tokens; its TTFT is the time to the first text."
        )
    doc["notes"].append(
        f"Every figure is the median of {args.repeat} round(s) with its range (min-max); the rounds are "
        "alternated (each round measures every dataset, level and target once), and a difference is claimed "
        "only where the ranges do not overlap."
    )
    if args.chat_shape is None:
        doc["notes"].append(
            "TTFT, TPOT and E2EL have one value per request, so P99 over a few requests is close to the maximum; "
            "ITL pools every gap of the level."
        )
    # The server is stopped now (when managed), so the baseline has the CPU to itself.
    hf_model = args.hf_model or server.model_path
    if args.no_baseline:
        pass
    elif args.chat_shape is not None:
        doc["notes"].append("No HF baseline for the chat workload: it measures single requests only.")
    elif not hf_model:
        doc["notes"].append("No HF baseline: pass --hf-model with the model folder the server serves.")
    else:
        job, names = baseline_job(args, hf_model, sampling, done)
        result = await run_baseline(args.hf_python or python, job, progress=not args.no_progress)
        add_baseline(doc, names, result)
        doc["notes"].append(
            "The HF baseline runs after the server has stopped (so that it has the machine to itself): "
            "its rounds follow each other, alternated across levels but not with the server's."
        )
    compare(doc)
    doc["machine"]["load_end"] = [round(x, 2) for x in os.getloadavg()]
    return dict(scrub(doc, [args.api_key, server.endpoint.api_key]))


def bench_command(cfg: AppConfig, args: argparse.Namespace, argv: list[str], python: str) -> int:
    """`bench`: check the options, run the benchmark, write the report and print where it is."""
    try:
        args = check_options(args)
        doc = asyncio.run(run(cfg, args, argv, python))
    except ServiceError as exc:
        print(f"bench: {exc.message}\n{exc.hint}".rstrip(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    for path in write_report(doc, Path(args.out_dir)):
        print(path)
    return 0
