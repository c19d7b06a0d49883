"""Wires configuration, hardware, model and engine together into a ready-to-run Supervisor."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from backend.config import AppConfig, EngineFlags, EngineName
from backend.engines.base import Endpoint, Engine, LaunchSpec, Target, engine_python
from backend.engines.registry import configured_engine, engine, engines_to_try
from backend.errors import Phrase
from backend.models.resolve import ResolvedModel
from backend.serving.canary import Canary
from backend.serving.hardware import Gpu, detect_gpus
from backend.serving.kept import find_kept
from backend.serving.preflight import check_launch
from backend.serving.process import free_port, new_api_key
from backend.serving.profiles import choose_profile, effective_flags
from backend.serving.state_file import read_key
from backend.serving.supervisor import Supervisor

log = logging.getLogger(__name__)


class Choice:
    """What the engine tune decided for this run: the configuration to serve with, and the figures behind it."""

    def __init__(self, cfg: AppConfig, engine: EngineName | None, summary: dict[str, Any]) -> None:
        self.cfg = cfg  # the configuration with the chosen format applied
        self.engine = engine  # the engine to try first (None: the usual order)
        self.summary = summary  # for /healthz and the doctor


# Decides the engine before the first start (backend.tuning): given the configuration and a way to show progress.
Chooser = Callable[[AppConfig, Callable[[Phrase | None], None]], Awaitable[Choice | None]]


def make_supervisor(cfg: AppConfig, choose: Chooser | None = None) -> Supervisor:
    """Return a Supervisor for `cfg`: engine, profile, port and API key are fixed here, once per run.

    With `choose` (engine.name auto on a CPU), the supervisor asks it before the first start which engine and
    format to run, and wires itself again with the answer. An engine an earlier run kept running (engine.keep_running,
    backend/serving/kept.py) lends its key and port, so that an unchanged launch can adopt it."""
    python = engine_python(cfg)
    configured = configured_engine(cfg)
    if configured is not None and not configured.spawns:
        api_key = cfg.server.api_key or new_api_key()
        target = Target(cfg.model.id, 0, api_key, python)
        spec = configured.launch(cfg, target, configured.flags(cfg, cfg.engine.flags))
        endpoint = Endpoint(spec.base_url, api_key, spec.served_name, external=not spec.spawns)
        return Supervisor(cfg, lambda: spec, endpoint, spec.flags)

    kept = find_kept(cfg)
    reuse = kept if kept is not None and cfg.engine.keep_running else None
    # The key of the last start, kept in engine.key: vLLM hashes its environment, VLLM_API_KEY included, into the
    # name of its compile cache, so a new key per start would compile afresh each time (docs/engines.md).
    api_key = cfg.server.api_key or (reuse.api_key if reuse else read_key(cfg) or new_api_key())
    gpus = detect_gpus()
    port = cfg.server.port or (reuse.port if reuse else free_port(cfg.server.host))
    endpoint = Endpoint(f"http://{cfg.server.host}:{port}", api_key, cfg.model.served_name)
    supervisor = Supervisor(cfg, lambda: _unwired(), endpoint, EngineFlags())  # wired on the next line
    supervisor.gpus = gpus
    supervisor.kept = kept
    _wire(supervisor, cfg, None, python, gpus, port)
    if choose is not None and not gpus:

        async def tune() -> None:
            def progress(phrase: Phrase | None) -> None:
                supervisor.status.progress = phrase

            choice = await choose(cfg, progress)
            supervisor.status.progress = None
            if choice is not None:
                supervisor.tune = choice.summary
                _wire(supervisor, choice.cfg, choice.engine, python, gpus, port)

        supervisor.before_start = tune
    return supervisor


def _unwired() -> LaunchSpec:
    raise RuntimeError("the supervisor started before it was wired")


def _wire(
    supervisor: Supervisor, cfg: AppConfig, preferred: EngineName | None, python: str, gpus: list[Gpu], port: int
) -> None:
    """Give `supervisor` its candidates, canary and launch preparation for `cfg` (`preferred` engine first)."""
    engines = engines_to_try(cfg, bool(gpus), python, preferred)
    profiles = {e.name: choose_profile(cfg, e, gpus) for e in engines}
    flags = {e.name: e.flags(cfg, effective_flags(cfg, profiles[e.name])) for e in engines}
    candidates = [c for e in engines for c in e.candidates(cfg, flags[e.name])]
    canary = Canary(cfg, candidates, python)
    first = engines[0]
    endpoint = supervisor.endpoint
    endpoint.api = first.api
    log.info("Engine %s (%s), serving on %s", first.name, ", ".join(c.label for c in candidates), endpoint.base_url)
    resolved: dict[str, ResolvedModel] = {}

    def note(text: str | None) -> None:
        supervisor.status.note = text

    def prepare() -> LaunchSpec:
        # Runs in a worker thread at each start attempt; once the model is resolved it stays resolved,
        # and a failure here (engine not installed, no model) is retried with the next attempt.
        candidate = canary.ladder.current
        chosen: Engine = engine(candidate.engine)
        endpoint.api = chosen.api
        chosen.check_installed(cfg, python)
        if chosen.name not in resolved:
            resolved[chosen.name] = chosen.resolve(cfg, python, note)
        model = resolved[chosen.name]
        note(model.note)
        spec = chosen.launch(cfg, Target(model.model, port, endpoint.api_key, python), flags[chosen.name],
                             candidate.variant)  # fmt: skip
        # A bad flag stops here, not in the child.
        check_launch(cfg, chosen, spec, model.model, gpus, python, profiles[chosen.name])
        weights = chosen.weights(cfg, candidate.variant, model)
        return spec.with_check(weights, chosen.build_id(cfg, python), demo=model.is_demo)

    supervisor.rewire(cfg, prepare, flags[first.name], canary)
