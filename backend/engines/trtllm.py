"""TensorRT-LLM as a second engine: trtllm-serve's command line, install and model checks, the engine build.

trtllm-serve speaks the same OpenAI API (and /health, /metrics) as vLLM, so the supervisor runs it the
same way. Its "pytorch" backend loads the Hugging Face folder directly; its "tensorrt" backend serves an
engine built ahead of time (`python -m backend build-trt-engine`: checkpoint conversion, then
trtllm-build). TensorRT-LLM supports a fixed list of architectures, and ERNIE 4.5 (Ernie4_5ForCausalLM)
was on neither backend's list when this was written: the check below reads the installed version's own
registries and says so, naming the engines that work.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from backend.config import ROOT, AppConfig, EngineFlags
from backend.engines.base import Engine, LaunchSpec, Target, installed_dists
from backend.engines.options import FlagParser, OptionsUnavailableError, has_package, read_options
from backend.errors import ConfigError, EngineNotInstalledError, Phrase, ServiceError
from backend.models.info import ModelInfo, read_model_info
from backend.models.resolve import resolve_model

log = logging.getLogger(__name__)

SERVE = "trtllm-serve"
BUILD = "trtllm-build"
SUPPORTED_MODELS_URL = "https://nvidia.github.io/TensorRT-LLM/models/supported-models.html"
WORKING_ENGINES = (
    "vllm (NVIDIA GPU), vllm-cpu (no GPU), llama.cpp (GGUF file, CPU or GPU) or external (an OpenAI-compatible "
    "server you run); see docs/engines.md"
)
DEFAULT_MAX_SEQ_LEN = 8192

TRTLLM_PARSER = FlagParser("trtllm", "tensorrt_llm", "trtllm-serve (TensorRT-LLM)")


def find_tool(python: str, name: str) -> str | None:
    """The console script `name` installed beside `python` (its venv's bin), else on PATH."""
    beside = Path(python).expanduser().parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def check_trtllm_installed(python: str) -> str:
    """Return trtllm-serve's path; raise EngineNotInstalledError when TensorRT-LLM is missing for `python`."""
    installed = has_package(python, "tensorrt_llm")
    serve = find_tool(python, SERVE)
    if not installed or serve is None:
        missing = Phrase("trtllm.no_package") if not installed else Phrase("trtllm.no_command", command=SERVE)
        raise EngineNotInstalledError.of(
            "engine.trtllm_missing", python=python, missing=missing, engines=WORKING_ENGINES
        )
    return serve


def check_architecture(model: ModelInfo | None, backend: str, supported: dict[str, list[str]], version: str) -> None:
    """Raise ConfigError when TensorRT-LLM's `backend` does not register the model's architecture."""
    if model is None or not model.architectures:
        log.warning("Model architecture unknown (no local config.json); TensorRT-LLM support not checked")
        return
    known = supported.get(backend)
    if not known:
        log.warning("Could not read TensorRT-LLM %s's %s model list; support not checked", version, backend)
        return
    arch = model.architectures[0]
    if arch in known:
        return
    other = "pytorch" if backend == "tensorrt" else "tensorrt"
    also = Phrase("trtllm.other_backend", other=other) if arch in supported.get(other, ()) else ""
    raise ConfigError.of(
        "config.trtllm_arch",
        version=version,
        backend=backend,
        arch=arch,
        path=model.path,
        also=also,
        engines=WORKING_ENGINES,
        url=SUPPORTED_MODELS_URL,
    )


def engine_dir(cfg: AppConfig) -> Path:
    """Where the built TensorRT engine lives: trtllm.engine_dir, else a folder per model under paths.cache."""
    if cfg.trtllm.engine_dir:
        return cfg.paths.resolve(cfg.trtllm.engine_dir)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", cfg.model.served_name)
    return cfg.paths.cache / "trt-engines" / f"{name}-tp{cfg.trtllm.tp_size}"


def max_seq_len(cfg: AppConfig, flags: EngineFlags) -> int:
    """trtllm.max_seq_len, else the profile's max_model_len, else 8192."""
    return cfg.trtllm.max_seq_len or flags.max_model_len or DEFAULT_MAX_SEQ_LEN


def serve_args(cfg: AppConfig, model: str, port: int, flags: EngineFlags) -> list[str]:
    """trtllm-serve's arguments after its positional MODEL (that is `serve_target`)."""
    t = cfg.trtllm
    args = [
        "--host",
        cfg.server.host,
        "--port",
        str(port),
        "--backend",
        t.backend,
        "--max_batch_size",
        str(t.max_batch_size),
        "--max_num_tokens",
        str(t.max_num_tokens),
        "--max_seq_len",
        str(max_seq_len(cfg, flags)),
        "--tp_size",
        str(t.tp_size),
        "--kv_cache_free_gpu_memory_fraction",
        str(t.kv_cache_free_gpu_memory_fraction),
        "--served_model_name",
        cfg.model.served_name,
    ]
    if t.backend == "tensorrt":
        args += ["--tokenizer", model]  # the engine folder has no tokenizer
    return args + list(t.extra_args)


def serve_target(cfg: AppConfig, model: str) -> str:
    """trtllm-serve's MODEL: the Hugging Face folder (pytorch backend) or the built engine (tensorrt)."""
    if cfg.trtllm.backend == "pytorch":
        return model
    folder = engine_dir(cfg)
    if not (folder / "config.json").exists():
        raise ConfigError.of("config.trtllm_no_engine", folder=folder)
    return str(folder)


def serve_env(model: str) -> dict[str, str]:
    """The child's environment: ours, unbuffered, offline when the model is a local folder."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "DO_NOT_TRACK": "1"}
    if Path(model).exists():
        env["HF_HUB_OFFLINE"] = "1"
    return env


def resolve_dtype(cfg: AppConfig, cc: tuple[int, int] | None) -> str:
    """The engine build's dtype: trtllm.dtype, else float16 below compute capability 8.0, else bfloat16."""
    if cfg.trtllm.dtype != "auto":
        return cfg.trtllm.dtype
    return "float16" if cc is not None and cc < (8, 0) else "bfloat16"


def convert_command(python: str, model: str, checkpoint_dir: Path, dtype: str, tp_size: int) -> list[str]:
    """Hugging Face folder -> TensorRT-LLM checkpoint (run with TensorRT-LLM's interpreter)."""
    return [python, "-m", "backend.child.trt_convert", model, str(checkpoint_dir), dtype, str(tp_size)]


def build_command(build_exe: str, cfg: AppConfig, checkpoint_dir: Path, output_dir: Path, seq_len: int) -> list[str]:
    """TensorRT-LLM checkpoint -> engine, sized by the trtllm section (a prompt may use the whole window)."""
    t = cfg.trtllm
    return [
        build_exe,
        "--checkpoint_dir",
        str(checkpoint_dir),
        "--output_dir",
        str(output_dir),
        "--max_batch_size",
        str(t.max_batch_size),
        "--max_num_tokens",
        str(t.max_num_tokens),
        "--max_seq_len",
        str(seq_len),
        "--max_input_len",
        str(seq_len),
        "--gemm_plugin",
        "auto",
    ]


def _run_step(title: str, argv: list[str]) -> None:
    print(f"\n== {title}: {' '.join(argv)}", flush=True)
    code = subprocess.run(argv, cwd=ROOT).returncode
    if code != 0:
        raise ServiceError(f"{title} failed with exit code {code}.", "See its output above.")


def build_engine(cfg: AppConfig, python: str, flags: EngineFlags, compute_capability: tuple[int, int] | None) -> Path:
    """Convert the configured model and build its TensorRT engine into engine_dir(cfg); return that folder.

    `flags` are the profile's (they size the engine), `compute_capability` the smallest GPU's (the dtype)."""
    check_trtllm_installed(python)
    build_exe = find_tool(python, BUILD)
    if build_exe is None:
        raise EngineNotInstalledError(
            f"{BUILD} is not installed beside {python} or on PATH.", "Reinstall TensorRT-LLM."
        )
    resolved = resolve_model(cfg, python)
    info = read_model_info(resolved.model)
    if info is None:
        raise ConfigError(
            f"The engine build needs a local model folder with config.json; {resolved.model} is not one.",
            "Download the model and set model.id to its folder.",
        )
    try:
        opts = read_options(TRTLLM_PARSER, python, cfg.paths.cache)
        check_architecture(info, "tensorrt", opts.architectures, opts.version)
    except OptionsUnavailableError as exc:
        log.warning("TensorRT-LLM's model list could not be read (%s); trying the build anyway", exc)
    dtype = resolve_dtype(cfg, compute_capability)
    seq_len = max_seq_len(cfg, flags)
    out = engine_dir(cfg)
    checkpoint = out.with_name(out.name + "-checkpoint")
    _run_step("Convert checkpoint", convert_command(python, resolved.model, checkpoint, dtype, cfg.trtllm.tp_size))
    _run_step("Build engine", build_command(build_exe, cfg, checkpoint, out, seq_len))
    (out / "ernie-chat-build.json").write_text(
        json.dumps({"model": resolved.model, "dtype": dtype, "max_seq_len": seq_len}, indent=2), encoding="utf-8"
    )
    return out


class Trtllm(Engine):
    """trtllm-serve: the same OpenAI API, /health and /metrics as vLLM; its flags are checked by its own parser."""

    name = "trtllm"
    on_gpu = True
    flag_parser = TRTLLM_PARSER

    def section_flags(self, cfg: AppConfig) -> dict[str, str]:
        return {token.partition("=")[0]: "trtllm.extra_args" for token in cfg.trtllm.extra_args}

    def installed(self, cfg: AppConfig, python: str) -> bool:
        return has_package(python, "tensorrt_llm") and find_tool(python, SERVE) is not None

    def check_installed(self, cfg: AppConfig, python: str) -> None:
        check_trtllm_installed(python)

    def flags(self, cfg: AppConfig, profile_flags: EngineFlags) -> EngineFlags:
        return profile_flags.merged(EngineFlags(max_model_len=max_seq_len(cfg, profile_flags)))

    def check_model(
        self, cfg: AppConfig, model: ModelInfo | None, supported: dict[str, list[str]], version: str
    ) -> None:
        check_architecture(model, cfg.trtllm.backend, supported, version)

    def build_id(self, cfg: AppConfig, python: str) -> str:
        return installed_dists(python, "tensorrt_llm")

    def launch(self, cfg: AppConfig, target: Target, flags: EngineFlags, variant: str | None = None) -> LaunchSpec:
        serve = find_tool(target.python, SERVE) or SERVE
        args = serve_args(cfg, target.model, target.port, flags)
        return LaunchSpec(
            engine=self.name,
            argv=[serve, serve_target(cfg, target.model), *args],
            args=args,
            env=serve_env(target.model),
            host=cfg.server.host,
            port=target.port,
            served_name=cfg.model.served_name,
            api_key=target.api_key,  # trtllm-serve checks no key; it listens on loopback only
            flags=self.flags(cfg, flags),
            variant=variant,
            capacity=cfg.trtllm.max_batch_size,
        )


def build_trt_engine_command(
    cfg: AppConfig, python: str, flags: EngineFlags, compute_capability: tuple[int, int] | None
) -> int:
    """`build-trt-engine`: build the TensorRT engine trtllm.backend: tensorrt serves (see build_engine)."""
    try:
        out = build_engine(cfg, python, flags, compute_capability)
    except ServiceError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"\nEngine built in {out}.")
    if cfg.trtllm.backend != "tensorrt" or cfg.engine.name != Trtllm.name:
        print("To serve it set engine.name: trtllm and trtllm.backend: tensorrt in config/backend.yaml.")
    return 0
