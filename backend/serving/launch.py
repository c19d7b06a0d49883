"""Wires configuration, hardware, model and engine together into a ready-to-run Supervisor."""

from __future__ import annotations

import logging

from backend.config import AppConfig
from backend.engines.base import Endpoint, Engine, LaunchSpec, Target, engine_python
from backend.engines.registry import configured_engine, engine, engines_to_try
from backend.models.resolve import ResolvedModel
from backend.serving.canary import Guard
from backend.serving.hardware import detect_gpus
from backend.serving.preflight import check_launch
from backend.serving.process import free_port, new_api_key
from backend.serving.profiles import choose_profile, effective_flags
from backend.serving.supervisor import Supervisor

log = logging.getLogger(__name__)


def make_supervisor(cfg: AppConfig) -> Supervisor:
    """Return a Supervisor for `cfg`: engine, profile, port and API key are fixed here, once per run."""
    api_key = cfg.server.api_key or new_api_key()
    python = engine_python(cfg)
    configured = configured_engine(cfg)
    if configured is not None and not configured.spawns:
        target = Target(cfg.model.id, 0, api_key, python)
        spec = configured.launch(cfg, target, configured.flags(cfg, cfg.engine.flags))
        return Supervisor(cfg, lambda: spec, Endpoint(spec.base_url, api_key, spec.served_name), spec.flags)

    gpus = detect_gpus()
    engines = engines_to_try(cfg, bool(gpus), python)
    profiles = {e.name: choose_profile(cfg, e, gpus) for e in engines}
    flags = {e.name: e.flags(cfg, effective_flags(cfg, profiles[e.name])) for e in engines}
    candidates = [c for e in engines for c in e.candidates(cfg, flags[e.name])]
    guard = Guard(cfg, candidates, python)
    first = engines[0]
    port = cfg.server.port or free_port(cfg.server.host)
    endpoint = Endpoint(f"http://{cfg.server.host}:{port}", api_key, cfg.model.served_name, api=first.api)
    log.info("Engine %s (%s), serving on %s", first.name, ", ".join(c.label for c in candidates), endpoint.base_url)
    resolved: dict[str, ResolvedModel] = {}

    def note(text: str | None) -> None:
        supervisor.status.note = text

    def prepare() -> LaunchSpec:
        # Runs in a worker thread at each start attempt; once the model is resolved it stays resolved,
        # and a failure here (engine not installed, no model) is retried with the next attempt.
        candidate = guard.current
        chosen: Engine = engine(candidate.engine)
        endpoint.api = chosen.api
        chosen.check_installed(cfg, python)
        if chosen.name not in resolved:
            resolved[chosen.name] = chosen.resolve(cfg, python, note)
        model = resolved[chosen.name]
        note(model.note)
        spec = chosen.launch(cfg, Target(model.model, port, api_key, python), flags[chosen.name], candidate.variant)
        # A bad flag stops here, not in the child.
        check_launch(cfg, chosen, spec, model.model, gpus, python, profiles[chosen.name])
        weights = chosen.weights(cfg, candidate.variant, model)
        return spec.with_check(weights, chosen.build_id(cfg, python), demo=model.is_demo)

    supervisor = Supervisor(cfg, prepare, endpoint, flags[first.name], guard=guard)
    supervisor.gpus = gpus
    return supervisor
