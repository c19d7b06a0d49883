"""An engine that outlives the app (engine.keep_running): the next start adopts it instead of starting another.

Off by default: the engine is then the app's child and never outlives it (backend/child/die_with_parent.py).
On, the engine starts without that guard and the app's stop leaves it running; the next start of the app finds it
through <data_dir>/engine.json and engine.key and adopts it when all of these hold:
- it is ours: the process with the recorded pid carries the recorded run mark (RUN_MARK) in its environment,
  which a reused pid or another program never does;
- it runs the launch this start would make: the same engine build, command line and engine environment (the
  launch fingerprint: a changed flag, model, profile, format, port or engine version makes another);
- it answers as ready (/health and /v1/models with the recorded key) within ADOPT_WAIT_S.
Otherwise an engine of ours is stopped (its whole process group) and a fresh one starts; with keep_running off,
an engine kept by an earlier run is always stopped first. `python -m backend stop-engine` stops one by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from backend.config import AppConfig
from backend.engines.base import LaunchSpec, bearer
from backend.serving.process import ProcessGroup
from backend.serving.readiness import is_ready
from backend.serving.state_file import read_key, read_state

log = logging.getLogger(__name__)

RUN_MARK = "ERNIE_ENGINE_RUN"  # in the engine's environment: which start of the app made it
ADOPT_WAIT_S = 10.0  # how long a kept engine may take to answer as ready before it is replaced
GONE = -1  # the exit code reported for a kept engine that went away (not our child: its code is unknown)


def new_run() -> str:
    return secrets.token_hex(8)


def fingerprint(spec: LaunchSpec) -> str:
    """What identifies a launch: engine, build, command line and the environment the engine adds to ours (the
    run mark aside). Two starts with the same fingerprint would run the same server."""
    added = {k: v for k, v in spec.env.items() if k != RUN_MARK and os.environ.get(k) != v}
    text = json.dumps([spec.engine, spec.build, spec.argv, sorted(added.items())])
    return hashlib.sha256(text.encode()).hexdigest()


def marked(spec: LaunchSpec, run: str) -> LaunchSpec:
    """`spec` whose process carries the run mark `run`."""
    spec.env[RUN_MARK] = run
    return spec


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def is_ours(pid: int, run: str) -> bool:
    """Whether process `pid` is alive and is the engine of run `run` (its environment says so)."""
    return bool(run) and _environ(pid).get(RUN_MARK) == run


@dataclass(frozen=True)
class Kept:
    """An engine of ours that an earlier run of the app left running."""

    pid: int
    run: str
    launch: str
    port: int
    api_key: str
    base_url: str

    async def answers(self, spec: LaunchSpec) -> bool:
        """Whether it answers as ready for `spec` (served name, key) within ADOPT_WAIT_S."""
        deadline = time.monotonic() + ADOPT_WAIT_S
        async with httpx.AsyncClient(base_url=self.base_url, timeout=5.0, trust_env=False) as http:
            while is_ours(self.pid, self.run):
                if await is_ready(http, bearer(spec.api_key), spec.served_name, spec.health_path):
                    return True
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(0.5)
        return False


def find_kept(cfg: AppConfig) -> Kept | None:
    """The engine an earlier run left running in this data folder, when it is alive and ours; else None."""
    state, key = read_state(cfg), read_key(cfg)
    pid, run, base_url = state.get("pid"), str(state.get("run") or ""), str(state.get("base_url") or "")
    if not isinstance(pid, int) or not key or not is_ours(pid, run):
        return None
    port = urlsplit(base_url).port
    if port is None:
        return None
    return Kept(pid, run, str(state.get("launch") or ""), port, key, base_url)


class KeptProcess(ProcessGroup):
    """A kept engine: watched and stopped like the app's child, though it is not ours to wait for (its exit code is
    unknown: GONE)."""

    def __init__(self, kept: Kept, log_path: Path) -> None:
        super().__init__(log_path)
        self.kept = kept
        with contextlib.suppress(OSError):
            self._offset = log_path.stat().st_size  # tail() shows what it writes from now on

    @property
    def pid(self) -> int | None:
        return self.kept.pid

    def exit_code(self) -> int | None:
        return None if is_ours(self.kept.pid, self.kept.run) else GONE

    async def _reaped(self) -> int | None:
        return GONE  # not our child: nothing to reap; stop() then waits for its group to be gone


def stop_command(cfg: AppConfig) -> int:
    """`python -m backend stop-engine`: stop the engine kept running in this data folder, if one is."""
    kept = find_kept(cfg)
    if kept is None:
        print(f"No engine of this app is running from {cfg.paths.data}: nothing to stop.")
        return 0
    asyncio.run(KeptProcess(kept, cfg.paths.engine_log).stop(cfg.timeouts.stop_grace_s))
    print(f"Stopped the engine (pid {kept.pid}, {kept.base_url}).")
    return 0
