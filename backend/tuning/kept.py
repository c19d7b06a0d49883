"""The tune's result, kept per machine: which engine and format won, with the figures of every candidate.

A result holds for one CPU (model name and instruction sets), one set of installed engine builds, one model and
one set of tune settings; anything else measures again. Kept as JSON under paths.cache_dir/tune/.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from backend.config import AppConfig

log = logging.getLogger(__name__)

VERSION = 2  # bump when the workload, the rule or the record's fields change


@dataclass
class Measured:
    """One candidate: how it fared (measured, or skipped and why) and its chat figures at 1 and N users."""

    label: str  # "llama.cpp q8_0"
    engine: str
    fmt: str
    outcome: str  # "measured" or "skipped: <why>"
    check: str = ""  # the answer check's verdict ("passed", "passed (cached)", "skipped: random weights")
    ready_s: float = 0.0
    one: dict[str, Any] | None = None  # backend.benchmarks.chat_workload.ChatLevel.summary() at one user
    many: dict[str, Any] | None = None  # the same at tune.users users

    @property
    def ok(self) -> bool:
        return self.outcome == "measured" and self.one is not None and self.many is not None


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
    # The 1-minute load average before and after: other work on the same cores distorts the figures 2-5x (a tune
    # measured beside a test run chose differently from the same machine at rest): `tune --force` when quiet.
    load: tuple[float, float] = (0.0, 0.0)

    def winner(self) -> Measured | None:
        return next((m for m in self.measured if m.label == self.chosen), None)

    def summary(self) -> dict[str, Any]:
        """For /healthz and the doctor: the choice, its figures and the others' outcomes."""
        won = self.winner()
        return {
            "chosen": self.chosen,
            "cpu": self.cpu,
            "users": self.users,
            "when": self.when,
            "seconds": round(self.seconds, 1),
            "rule": self.rule,
            "load": list(self.load),
            "figures": {m.label: figures(m) for m in self.measured},
            "decode_tok_s_1_user": figures(won)["decode_tok_s_1"] if won else None,
        }


def figures(m: Measured) -> dict[str, Any]:
    """The figures of one candidate a person reads: decode tok/s and first text at 1 and N users, or why not."""
    if not m.ok:
        return {"outcome": m.outcome}
    assert m.one is not None and m.many is not None
    return {
        "outcome": m.outcome,
        "check": m.check,
        "decode_tok_s_1": _p50(m.one, "decode_tok_s"),
        "first_text_ms_1": _p50(m.one, "first_text_ms", "first_chunk_ms"),
        "decode_tok_s_n": _p50(m.many, "decode_tok_s"),
        "first_text_ms_n": _p50(m.many, "first_text_ms", "first_chunk_ms"),
        "output_tok_s_n": round(float(m.many["output_tok_s"]), 1),
    }


def _p50(level: dict[str, Any], name: str, instead: str = "") -> float | None:
    """A figure's P50, or `instead`'s where the level has none (the first token for a model without text)."""
    value = level.get(name) or level.get(instead)
    return round(float(value["p50"]), 1) if value else None


def tune_key(cfg: AppConfig, cpu: str, builds: list[str], model: str) -> str:
    """What a result holds for: the CPU, the engine builds, the model and the settings that change the answer."""
    t = cfg.tune
    parts = [str(VERSION), cpu, *builds, model, cfg.engine.name, cfg.llamacpp.quantization, str(t.users),
             ",".join(t.formats), cfg.model.load_format]  # fmt: skip
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def result_path(cfg: AppConfig, key: str) -> Path:
    folder = cfg.paths.resolve(cfg.tune.dir) if cfg.tune.dir else cfg.paths.cache / "tune"
    return folder / f"{key}.json"


def load(cfg: AppConfig, key: str) -> TuneResult | None:
    """The kept result for `key`, or None (none kept, or unreadable: measured again)."""
    path = result_path(cfg, key)
    try:
        data = json.loads(path.read_text())
        measured = [Measured(**m) for m in data.pop("measured")]
        load = tuple(data.pop("load", (0.0, 0.0)))
        return TuneResult(**data, measured=measured, load=(float(load[0]), float(load[1])))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.warning("Ignoring the kept tune result %s (%s): measuring again", path, exc)
        return None


def save(cfg: AppConfig, result: TuneResult) -> Path:
    """Keep `result` (atomically) and return its file."""
    path = result_path(cfg, result.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(result), indent=1, ensure_ascii=False))
    tmp.replace(path)
    return path
