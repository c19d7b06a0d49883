"""Wires configuration, hardware, model and engine together into a ready-to-run Supervisor."""

from __future__ import annotations

import logging

from backend.client import Endpoint
from backend.config import AppConfig
from backend.engines import (
    LaunchSpec,
    build_launch,
    check_vllm_installed,
    choose_engine,
    choose_profile,
    effective_flags,
    engine_python,
    external_launch,
)
from backend.hardware import detect_gpus
from backend.llamacpp import ENGINE as LLAMACPP
from backend.llamacpp import llamacpp_flags, prepare_launch
from backend.models import ResolvedModel, resolve_model
from backend.preflight import check_launch
from backend.supervisor import Supervisor, free_port, new_api_key
from backend.trtllm import check_trtllm_installed

log = logging.getLogger(__name__)


def make_supervisor(cfg: AppConfig) -> Supervisor:
    """Return a Supervisor for `cfg`: engine, profile, port and API key are fixed here, once per run."""
    api_key = cfg.server.api_key or new_api_key()
    if cfg.engine.name == "external":
        spec = external_launch(cfg, api_key)
        return Supervisor(cfg, lambda: spec, Endpoint(spec.base_url, api_key, spec.served_name), spec.flags)

    gpus = detect_gpus()
    engine = choose_engine(cfg, gpus)
    profile = choose_profile(cfg, engine, gpus)
    flags = llamacpp_flags(cfg) if engine == LLAMACPP else effective_flags(cfg, profile)
    port = cfg.server.port or free_port(cfg.server.host)
    endpoint = Endpoint(f"http://{cfg.server.host}:{port}", api_key, cfg.model.served_name)
    log.info("Engine %s, profile %s, serving on %s", engine, profile, endpoint.base_url)
    resolved: list[ResolvedModel] = []

    def prepare() -> LaunchSpec:
        # Runs in a worker thread at each start attempt; once the model is resolved it stays resolved,
        # and a failure here (engine not installed, no model) is retried with the next attempt.
        if engine == LLAMACPP:
            return prepare_launch(cfg, port, api_key, resolved, note=lambda t: setattr(supervisor.status, "note", t))
        python = engine_python(cfg)
        if engine == "trtllm":
            check_trtllm_installed(python)
        else:
            check_vllm_installed(python)
        if not resolved:
            resolved.append(resolve_model(cfg, python))
        supervisor.status.note = resolved[0].note
        spec = build_launch(cfg, engine, resolved[0].model, port, api_key, python=python, flags=flags)
        check_launch(cfg, spec, resolved[0].model, gpus, python, profile)  # a bad flag stops here, not in the child
        return spec

    supervisor = Supervisor(cfg, prepare, endpoint, flags)
    return supervisor
