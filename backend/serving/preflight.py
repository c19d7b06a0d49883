"""Checks run after the command line is built and before the engine is spawned.

What the hardware can run (backend.serving.compat), whether TensorRT-LLM supports the model (backend.engines.trtllm),
and every flag against the engine's own parser (backend.engines.options). A problem becomes one
ConfigError that names the key and the flag, shown in the chat instead of a crashed child's log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from backend.config import AppConfig, load_config
from backend.engines.options import EngineOptions, OptionsUnavailableError, check_args, read_options
from backend.engines.trtllm import check_architecture, check_trtllm_installed
from backend.engines.vllm import (
    VLLM_FLAGS,
    LaunchSpec,
    build_launch,
    choose_engine,
    choose_profile,
    effective_flags,
    engine_python,
)
from backend.errors import ConfigError, ServiceError
from backend.serving.compat import check_compatibility, read_model_info
from backend.serving.hardware import Gpu, detect_cpu_flags, detect_gpus
from backend.serving.profiles import select_profile

log = logging.getLogger(__name__)

VLLM_ENGINES = frozenset({"vllm", "vllm-cpu"})


def engine_args(spec: LaunchSpec) -> list[str]:
    """The flags part of the engine's argv: after `python -m module` (vLLM) or `trtllm-serve MODEL`."""
    if spec.engine in VLLM_ENGINES:
        return spec.argv[5:] if spec.argv[3:4] == ["serve"] else spec.argv[3:]
    return spec.argv[2:]


def flag_origin(cfg: AppConfig, profile: str | None) -> Callable[[str], str]:
    """Map a flag to the configuration key that put it on the command line, for error messages."""
    own = cfg.engine.flags.model_fields_set  # engine.flags values replace the profile's, lists included
    base = cfg.profiles.get(profile or "")

    def key(name: str) -> str:
        return f"engine.flags.{name}" if name in own or base is None else f"profiles.{profile}.{name}"

    origins: dict[str, str] = {flag: key(name) for name, flag in VLLM_FLAGS.items()}
    extra = cfg.engine.flags.extra_args if "extra_args" in own or base is None else base.extra_args
    for token in extra:
        origins[token.partition("=")[0]] = key("extra_args")
    for token in cfg.trtllm.extra_args:
        origins.setdefault(token.partition("=")[0], "trtllm.extra_args")

    def origin(flag: str) -> str:
        return origins.get(flag, "the app's own command line") + ": "

    return origin


def check_flags(cfg: AppConfig, spec: LaunchSpec, options: EngineOptions, profile: str | None = None) -> None:
    """Raise ConfigError naming every flag of `spec` the engine does not accept."""
    problems = check_args(engine_args(spec), options, flag_origin(cfg, profile))
    if problems:
        raise ConfigError(
            f"{len(problems)} engine flag problem(s): " + " ".join(problems),
            "Fix or remove them in config/backend.yaml; `python -m backend check-flags --list` prints the "
            "flags the installed engine has.",
        )


def check_launch(cfg: AppConfig, spec: LaunchSpec, model: str, gpus: list[Gpu], python: str, profile: str) -> None:
    """Everything checked before `spec` is spawned; raises ConfigError with what to change."""
    if spec.engine not in VLLM_ENGINES and spec.engine != "trtllm":
        return
    info = read_model_info(model)
    cpu_flags = detect_cpu_flags() if spec.engine == "vllm-cpu" else None
    for note in check_compatibility(spec.flags, spec.engine, gpus, info, cpu_flags):
        log.info("%s", note)
    package = "trtllm" if spec.engine == "trtllm" else "vllm"
    try:
        options = read_options(package, python, cfg.paths.cache)
    except OptionsUnavailableError as exc:
        log.warning("Engine flags not checked: %s", exc)
        return
    if spec.engine == "trtllm":
        check_architecture(info, cfg.trtllm.backend, options.architectures, options.version)
    check_flags(cfg, spec, options, profile)


def _check_profile(cfg: AppConfig, engine: str, profile: str, options: EngineOptions, python: str) -> list[str]:
    flags = effective_flags(cfg, profile)
    try:
        spec = build_launch(cfg, engine, cfg.model.id, cfg.server.port or 8100, "check", python=python, flags=flags)
    except ServiceError as exc:
        return [str(exc)]
    return check_args(engine_args(spec), options, flag_origin(cfg, profile))


def main(argv: list[str] | None = None) -> int:
    """`python -m backend check-flags [--all-profiles] [--list]`: check flags against the installed engine."""
    args = argv or []
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        cfg = load_config()
    except ConfigError as exc:
        print(exc)
        return 1
    gpus = detect_gpus()
    engine = choose_engine(cfg, gpus)
    if engine not in VLLM_ENGINES and engine != "trtllm":
        print(f"Engine {engine}: this app starts no engine with flags of its own to check.")
        return 0
    python = engine_python(cfg)
    try:
        if engine == "trtllm":
            check_trtllm_installed(python)
        options = read_options("trtllm" if engine == "trtllm" else "vllm", python, cfg.paths.cache)
    except (ServiceError, OptionsUnavailableError) as exc:
        print(exc)
        return 1
    if "--list" in args:
        print("\n".join(sorted(options.options)))
        return 0
    chosen = select_profile(gpus, engine, cfg.profiles)
    print(f"{options.label} (options cached in {cfg.paths.cache / 'engine-options'})")
    print(f"Detected profile: {choose_profile(cfg, engine, gpus)} ({chosen.reason})")
    profiles = sorted(cfg.profiles) if "--all-profiles" in args else [choose_profile(cfg, engine, gpus)]
    failed = 0
    for profile in profiles:
        target = engine if engine == "trtllm" else ("vllm-cpu" if profile == "cpu" else "vllm")
        problems = _check_profile(cfg, target, profile, options, python)
        failed += bool(problems)
        print(f"profile {profile} ({target}): " + ("OK" if not problems else "\n  " + "\n  ".join(problems)))
    return 1 if failed else 0
