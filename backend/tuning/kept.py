"""The tune's result, kept per machine: which engine and format won, why, and every candidate's figures per round.

A result holds for one CPU (model name and instruction sets), one set of installed engine builds, one model and
one set of tune settings; anything else measures again. Nothing else enters the key: login, the API, the data
folder or the port give the same result on the same machine. Kept as JSON under paths.cache_dir/tune/.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from backend.benchmarks.stats import spread
from backend.config import AppConfig
from backend.files import atomic_write

log = logging.getLogger(__name__)

VERSION = 6  # bump when the workload, the rule or the record's fields change


@dataclass
class Round:
    """One round of one candidate: its chat figures alone and at tune.users at once, and what disturbed them."""

    one: dict[str, Any]  # backend.benchmarks.chat_workload.ChatLevel.summary() at one user
    many: dict[str, Any]  # the same at tune.users users
    other: float = 0.0  # the largest share of the cores other processes used during either level (0.0: none)
    again: int = 0  # levels measured again because other work disturbed them


@dataclass
class Measured:
    """One candidate: how it fared (measured, or skipped and why) and its rounds."""

    label: str  # "llama.cpp q8_0", "llama.cpp q4_1 sapphirerapids"
    engine: str
    fmt: str
    outcome: str  # "measured" or "skipped: <why>"
    check: str = ""  # the answer check's verdict ("passed", "passed (cached)", "skipped: random weights")
    ready_s: float = 0.0
    rounds: list[Round] = field(default_factory=list)
    # Why it measured no further rounds though it served: so much slower than the quickest in a round that no later
    # round could make it the choice (backend.tuning.tuner.DROP); "" where it ran every round.
    dropped: str = ""
    build: str = ""  # the engine's own build measured (llama.cpp's CPU kernels: "zen4"); "": as configured

    @property
    def ok(self) -> bool:
        return self.outcome == "measured" and bool(self.rounds)


@dataclass
class Places:
    """How many replies the chosen candidate runs at once (its places), and the totals that decided it."""

    chosen: int
    reason: str
    # users at once (as text: JSON keys) -> the total output tokens a second of each round, in the order measured
    totals: dict[str, list[float]] = field(default_factory=dict)
    # the same levels -> each round's median decode tokens a second per reply (what each user sees)
    per_reply: dict[str, list[float]] = field(default_factory=dict)
    configured: int | None = None  # the engine's own setting, the most measured
    disturbed: int = 0  # levels that stayed disturbed by other work after measuring them again

    def summary(self) -> dict[str, Any]:
        """For /healthz and the doctor: the places, why, and each level's median total and per-reply pace."""
        levels = {}
        for users, totals in self.totals.items():
            total = median_and_range(totals)
            pace = median_and_range(self.per_reply.get(users, []))
            levels[users] = {
                "total_tok_s": round(total[0], 1) if total else None,
                "total_tok_s_range": [round(total[1], 1), round(total[2], 1)] if total else None,
                "per_reply_tok_s": round(pace[0], 1) if pace else None,
            }
        return {"chosen": self.chosen, "reason": self.reason, "configured": self.configured, "levels": levels}


@dataclass
class TuneResult:
    """What one tune found on this machine; `chosen` is a label of `measured` (None: no candidate served)."""

    key: str
    cpu: str
    users: int
    chosen: str | None
    rule: str
    seconds: float
    when: str
    measured: list[Measured] = field(default_factory=list)
    # The 1-minute load average before and after (for a person reading the record; the tune itself watches the
    # other processes' CPU time during every level: Round.other).
    load: tuple[float, float] = (0.0, 0.0)
    reason: str = ""  # why `chosen`: beyond the spread of the others, or the default order among those within it
    disturbed: int = 0  # levels that stayed disturbed by other work after measuring them again
    places: Places | None = None  # the chosen one's places (None: tune.places off, or nothing chosen)

    def winner(self) -> Measured | None:
        return next((m for m in self.measured if m.label == self.chosen), None)

    def summary(self) -> dict[str, Any]:
        """For /healthz and the doctor: the choice, why, its figures and the others' outcomes."""
        won = self.winner()
        return {
            "chosen": self.chosen,
            "reason": self.reason,
            "cpu": self.cpu,
            "users": self.users,
            "when": self.when,
            "seconds": round(self.seconds, 1),
            "rule": self.rule,
            "load": list(self.load),
            "disturbed": self.disturbed,
            "figures": {m.label: figures(m) for m in self.measured},
            "decode_tok_s_1_user": figures(won)["decode_tok_s_1"] if won else None,
            "places": self.places.summary() if self.places else None,
        }


def median_and_range(values: list[float]) -> tuple[float, float, float] | None:
    """(median, min, max) of `values` (benchmarks.stats.spread, the project's one definition), or None for none."""
    if not values:
        return None
    s = spread(values)
    return s.median, s.low, s.high


def level_p50(level: dict[str, Any], name: str, instead: str = "") -> float | None:
    """A level figure's P50, or `instead`'s where the level has none (the first token for a model without text)."""
    value = level.get(name) or level.get(instead)
    return float(value["p50"]) if value else None


def across_rounds(m: Measured, load: str, name: str, instead: str = "") -> tuple[float, float, float] | None:
    """The median and the range over the rounds of one level figure ("one" or "many")."""
    values = [level_p50(getattr(r, load), name, instead) for r in m.rounds]
    return median_and_range([v for v in values if v is not None])


def figures(m: Measured) -> dict[str, Any]:
    """The figures of one candidate a person reads: medians over the rounds (and their ranges), or why not."""
    if not m.ok:
        return {"outcome": m.outcome}

    def med(load: str, name: str, instead: str = "") -> float | None:
        found = across_rounds(m, load, name, instead)
        return round(found[0], 1) if found else None

    def spread(load: str, name: str, instead: str = "") -> list[float] | None:
        found = across_rounds(m, load, name, instead)
        return [round(found[1], 1), round(found[2], 1)] if found else None

    output = median_and_range([float(r.many["output_tok_s"]) for r in m.rounds])
    return {
        "outcome": m.outcome,
        "check": m.check,
        "rounds": len(m.rounds),
        "decode_tok_s_1": med("one", "decode_tok_s"),
        "decode_tok_s_1_range": spread("one", "decode_tok_s"),
        "first_text_ms_1": med("one", "first_text_ms", "first_chunk_ms"),
        "first_text_ms_1_range": spread("one", "first_text_ms", "first_chunk_ms"),
        "decode_tok_s_n": med("many", "decode_tok_s"),
        "decode_tok_s_n_range": spread("many", "decode_tok_s"),
        "first_text_ms_n": med("many", "first_text_ms", "first_chunk_ms"),
        "output_tok_s_n": round(output[0], 1) if output else None,
        "turns": sum(int(r.one["turns"]) + int(r.many["turns"]) for r in m.rounds),
        "other_max": max(r.other for r in m.rounds),
        **({"dropped": m.dropped} if m.dropped else {}),
    }


def tune_key(cfg: AppConfig, cpu: str, builds: list[str], model: str, candidates: list[str]) -> str:
    """What a result holds for: the CPU, the engine builds, the model, the settings that change the answer and the
    candidates measured (a release that measures another candidate measures again)."""
    t = cfg.tune
    parts = [str(VERSION), cpu, *builds, model, cfg.engine.name, cfg.llamacpp.quantization, str(t.users),
             ",".join(t.formats), str(t.rounds), str(t.replies), str(t.places), str(cfg.llamacpp.parallel),
             str(cfg.engine.flags.max_num_seqs), cfg.model.load_format, cfg.llamacpp.cpu_variant,
             str(t.kernel_builds),
             ",".join(candidates)]  # fmt: skip
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def result_path(cfg: AppConfig, key: str) -> Path:
    folder = cfg.paths.resolve(cfg.tune.dir) if cfg.tune.dir else cfg.paths.cache / "tune"
    return folder / f"{key}.json"


def load(cfg: AppConfig, key: str) -> TuneResult | None:
    """The kept result for `key`, or None (none kept, or unreadable: measured again)."""
    path = result_path(cfg, key)
    try:
        data = json.loads(path.read_text())
        measured = [
            Measured(**{**m, "rounds": [Round(**r) for r in m.get("rounds", [])]}) for m in data.pop("measured")
        ]
        load = tuple(data.pop("load", (0.0, 0.0)))
        places = data.pop("places", None)
        return TuneResult(
            **data,
            measured=measured,
            load=(float(load[0]), float(load[1])),
            places=Places(**places) if places else None,
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.warning("Ignoring the kept tune result %s (%s): measuring again", path, exc)
        return None


def save(cfg: AppConfig, result: TuneResult) -> Path:
    """Keep `result` (atomically) and return its file."""
    path = result_path(cfg, result.key)
    atomic_write(path, json.dumps(asdict(result), indent=1, ensure_ascii=False))
    return path
