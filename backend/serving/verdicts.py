"""The verdict cache: what the answer check said of a candidate on this machine, kept so that a later start of a
candidate that passed costs nothing and one that crashed or failed is skipped at once."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from backend.engines.base import Weights
from backend.files import atomic_write
from backend.serving.hardware import cpu_identity

REMEMBERED = " (remembered from an earlier start)"  # how a cached rejection is told


def cpu_signature() -> str:
    """The CPU model name and a hash of the instruction sets it advertises (a verdict holds for these only)."""
    model, flags = cpu_identity()
    return f"{model} [{hashlib.sha256(' '.join(sorted(flags)).encode()).hexdigest()[:8]}]"


def files_key(path: Path) -> str:
    """A hash of a model file or folder: its path and the name, size and mtime of every file in it."""
    digest = hashlib.sha256(str(path.resolve()).encode())
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    for file in files:
        stat = file.stat()
        digest.update(f"{file.name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


class VerdictCache:
    """Verdicts by candidate, engine build, CPU, weights and number format, in one JSON file."""

    def __init__(self, file: Path, cpu: str) -> None:
        self.file = file
        self.cpu = cpu

    def key(self, label: str, weights: Weights, build: str) -> str:
        parts = [label, build, self.cpu, weights.model, weights.gguf_file or "", weights.number_format]
        model_path = Path(weights.model) / (weights.gguf_file or "")
        if model_path.exists():
            parts.append(files_key(model_path))
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.file.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, label: str, weights: Weights, build: str) -> dict[str, Any] | None:
        """The verdict kept for this candidate and these weights, if any."""
        record = self._load().get(self.key(label, weights, build))
        return record if isinstance(record, dict) else None

    def store(self, label: str, weights: Weights, build: str, record: dict[str, Any]) -> None:
        """Keep `record` (passed, reason, ...) as this candidate's verdict, with the candidate, CPU and time."""
        data = self._load()
        data[self.key(label, weights, build)] = {"candidate": label, **record, "cpu": self.cpu, "when": now()}
        atomic_write(self.file, json.dumps(data, indent=1, ensure_ascii=False))

    def rejection(self, label: str, weights: Weights, build: str) -> str | None:
        """Why this candidate failed before on this machine, if it did (said as remembered)."""
        record = self.get(label, weights, build)
        return f"{record['reason']}{REMEMBERED}" if record and not record.get("passed") else None

    def record_crash(self, label: str, weights: Weights, build: str, reason: str) -> None:
        """Remember that this candidate crashes here, so that the next start skips it at once."""
        reason = reason.removesuffix(REMEMBERED)  # a remembered crash is kept as first seen, not said again
        self.store(label, weights, build, {"passed": False, "reason": reason})
