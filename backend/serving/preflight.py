"""Checks run after the command line is built and before the engine is spawned.

What the hardware can run (backend.serving.compat), whether the installed engine supports the model
(Engine.check_model, e.g. TensorRT-LLM's registries), and every flag against the engine's own parser
(backend.engines.options). A problem becomes one ConfigError that names the key and the flag, shown in the
chat instead of a crashed child's log.
"""

from __future__ import annotations

import logging

from backend.config import AppConfig
from backend.engines.base import Engine, LaunchSpec, Target, engine_python
from backend.engines.options import EngineOptions, OptionsUnavailableError, Origin, check_args, read_options
from backend.engines.registry import ENGINES, engine_for_profile, profile_engine
from backend.errors import ConfigError, Phrase, ServiceError
from backend.models.info import read_model_info
from backend.serving.compat import check_compatibility
from backend.serving.hardware import Gpu, detect_cpu_flags, detect_gpus
from backend.serving.profiles import choose_profile, effective_flags, select_profile

log = logging.getLogger(__name__)


def flag_origin(cfg: AppConfig, chosen: Engine, profile: str | None) -> Origin:
    """Map a flag to the configuration key that put it on the command line, for error messages."""
    own = cfg.engine.flags.model_fields_set  # engine.flags values replace the profile's, lists included
    base = cfg.profiles.get(profile or "")

    def key(name: str) -> str:
        return f"engine.flags.{name}" if name in own or base is None else f"profiles.{profile}.{name}"

    origins: dict[str, str] = {flag: key(name) for name, flag in chosen.flag_for.items()}
    extra = cfg.engine.flags.extra_args if "extra_args" in own or base is None else base.extra_args
    for token in extra:
        origins[token.partition("=")[0]] = key("extra_args")
    for flag, section in chosen.section_flags(cfg).items():
        origins.setdefault(flag, section)

    def origin(flag: str) -> str | Phrase:
        return origins.get(flag) or Phrase("flags.own_command_line")

    return origin


def check_flags(cfg: AppConfig, spec: LaunchSpec, options: EngineOptions, profile: str | None = None) -> None:
    """Raise ConfigError naming every flag of `spec` the engine does not accept."""
    problems = check_args(spec.args, options, flag_origin(cfg, ENGINES[spec.engine], profile))
    if problems:
        raise ConfigError.of("config.engine_flags", count=len(problems), problems=problems)


def check_launch(
    cfg: AppConfig, engine: Engine, spec: LaunchSpec, model: str, gpus: list[Gpu], python: str, profile: str
) -> None:
    """Everything checked before `spec` is spawned; raises ConfigError with what to change."""
    if engine.flag_parser is None:
        return
    info = read_model_info(model)
    cpu_flags = None if engine.on_gpu else detect_cpu_flags()
    for note in check_compatibility(spec.flags, engine, gpus, info, cpu_flags):
        log.info("%s", note)
    try:
        options = read_options(engine.flag_parser, python, cfg.paths.cache)
    except OptionsUnavailableError as exc:
        log.warning("Engine flags not checked: %s", exc)
        return
    engine.check_model(cfg, info, options.architectures, options.version)
    check_flags(cfg, spec, options, profile)


def _check_profile(
    cfg: AppConfig, engine: Engine, profile: str, options: EngineOptions, python: str
) -> list[Phrase] | list[str]:
    flags = engine.flags(cfg, effective_flags(cfg, profile))
    try:
        spec = engine.launch(cfg, Target(cfg.model.id, cfg.server.port or 8100, "check", python), flags)
    except ServiceError as exc:
        return [str(exc)]
    return check_args(spec.args, options, flag_origin(cfg, engine, profile))


def check_flags_command(cfg: AppConfig, list_only: bool = False, all_profiles: bool = False) -> int:
    """`check-flags`: check the profiles' flags against the installed engine's parser; print the result."""
    gpus = detect_gpus()
    engine = profile_engine(cfg, bool(gpus))
    if engine.flag_parser is None:
        print(f"Engine {engine.name}: this app starts no engine with flags of its own to check.")
        return 0
    python = engine_python(cfg)
    try:
        engine.check_installed(cfg, python)
        options = read_options(engine.flag_parser, python, cfg.paths.cache)
    except (ServiceError, OptionsUnavailableError) as exc:
        print(exc)
        return 1
    if list_only:
        print("\n".join(sorted(options.options)))
        return 0
    print(f"{options.label} (options cached in {cfg.paths.cache / 'engine-options'})")
    if cfg.engine.profile == "auto":
        chosen = select_profile(gpus, engine, cfg.profiles)
        print(f"Detected profile: {chosen.name} ({chosen.reason})")
    else:
        print(f"Profile: {cfg.engine.profile} (set by engine.profile)")
    profiles = sorted(cfg.profiles) if all_profiles else [choose_profile(cfg, engine, gpus)]
    failed = 0
    for profile in profiles:
        target = engine_for_profile(engine, profile)
        problems = _check_profile(cfg, target, profile, options, python)
        failed += bool(problems)
        shown = [str(problem) for problem in problems]
        print(f"profile {profile} ({target.name}): " + ("OK" if not shown else "\n  " + "\n  ".join(shown)))
    return 1 if failed else 0
