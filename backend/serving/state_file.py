"""Where the running engine is, for the doctor and the benchmark snapshot: <data_dir>/engine.json.

The supervisor writes it at every start; the engine's API key goes beside it in engine.key, readable by the
app's user only (the key is already in the engine's own environment, which that user can read anyway).
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from backend.config import AppConfig
from backend.engines.base import LaunchSpec


def write_state(cfg: AppConfig, spec: LaunchSpec, pid: int | None, run: str = "", launch: str = "") -> None:
    """Record the engine that just started (never fails the start: a read-only data folder only loses this); `run`
    and `launch` are its run mark and launch fingerprint (backend/serving/kept.py)."""
    state = {
        "engine": spec.engine,
        "base_url": spec.base_url,
        "pid": pid,
        "served_name": spec.served_name,
        "log": str(cfg.paths.engine_log),
        "run": run,
        "launch": launch,
    }
    with contextlib.suppress(OSError):
        cfg.paths.engine_state.write_text(json.dumps(state, indent=2), encoding="utf-8")
        key = cfg.paths.engine_state.with_suffix(".key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(spec.api_key)


def read_state(cfg: AppConfig) -> dict[str, Any]:
    """The state file's contents, or {} when there is none (the app has not started an engine here)."""
    try:
        data = json.loads(cfg.paths.engine_state.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_key(cfg: AppConfig) -> str | None:
    """The running engine's API key, or None."""
    try:
        return cfg.paths.engine_state.with_suffix(".key").read_text(encoding="utf-8").strip() or None
    except OSError:
        return None
