"""Building an engine's launch in tests the way backend.serving.launch does: profile flags, then the engine's own."""

from __future__ import annotations

from backend.config import AppConfig, EngineFlags, EngineName
from backend.engines.base import LaunchSpec, Target
from backend.engines.registry import engine
from backend.serving.profiles import choose_profile, effective_flags


def launch(
    cfg: AppConfig,
    name: EngineName,
    model: str,
    port: int,
    api_key: str,
    python: str = "/py",
    flags: EngineFlags | None = None,
) -> LaunchSpec:
    """The LaunchSpec that engine `name` builds for `model` (with the chosen profile's flags unless given)."""
    chosen = engine(name)
    if flags is None:
        flags = chosen.flags(cfg, effective_flags(cfg, choose_profile(cfg, chosen)))
    return chosen.launch(cfg, Target(model, port, api_key, python), flags)
