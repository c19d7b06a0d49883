"""Engine command lines: which engine and profile to use, and the exact argument list and environment."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from backend.config import ROOT, AppConfig, EngineFlags
from backend.engines import trtllm
from backend.engines.options import has_package
from backend.errors import ConfigError, EngineNotInstalledError
from backend.serving.canary import Weights
from backend.serving.hardware import Gpu
from backend.serving.profiles import select_profile

ENGINE_VENV_PYTHON = ROOT / ".venv-engine" / "bin" / "python"

# EngineFlags field -> vLLM flag; booleans become bare switches.
VLLM_FLAGS: dict[str, str] = {
    "max_model_len": "--max-model-len",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "enforce_eager": "--enforce-eager",
    "block_size": "--block-size",
    "dtype": "--dtype",
    "quantization": "--quantization",
    "kv_cache_dtype": "--kv-cache-dtype",
    "tensor_parallel_size": "--tensor-parallel-size",
    "data_parallel_size": "--data-parallel-size",
    "stream_interval": "--stream-interval",
}
CPU_ONLY_FLAGS = {"gpu_memory_utilization"}


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one engine process and to talk to it."""

    engine: str
    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    served_name: str
    api_key: str
    flags: EngineFlags = field(default_factory=EngineFlags)
    url: str | None = None  # set for an external server; else derived from host and port
    health_path: str = "/health"  # a GET that answers 200 while the server is alive
    cwd: str | None = None  # the child's working directory (None: the app's)
    variant: str | None = None  # which of the engine's own alternatives runs (llama.cpp: the CPU kernels)
    weights: Weights | None = None  # what the canary checks this engine against (None: no check)
    build: str = ""  # identifies the engine's installed build, for the canary's verdict cache
    demo: bool = False  # the offline demo model answers (the chat uses the demo's own defaults)

    def with_check(self, weights: Weights, build: str, demo: bool = False) -> LaunchSpec:
        """This spec with what the canary checks it against (and whether it serves the demo model)."""
        return dataclasses.replace(self, weights=weights, build=build, demo=demo)

    @property
    def base_url(self) -> str:
        """The server's root URL (without /v1)."""
        return (self.url or f"http://{self.host}:{self.port}").rstrip("/")


def choose_engine(cfg: AppConfig, gpus: list[Gpu]) -> str:
    """The vLLM engine the profiles' flags are for: the configured one, or vllm with a GPU and vllm-cpu without.

    Which engines the app actually tries (llama.cpp first on a CPU) is backend.serving.launch.choose_engines."""
    if cfg.engine.name != "auto":
        return cfg.engine.name
    return "vllm" if gpus else "vllm-cpu"


def choose_profile(cfg: AppConfig, engine: str, gpus: list[Gpu] | None = None) -> str:
    """Return the profile name: the configured one, or the one that suits the detected GPUs (backend.serving.profiles)."""
    if cfg.engine.profile != "auto":
        return cfg.engine.profile
    return select_profile(gpus or [], engine, cfg.profiles).name


def effective_flags(cfg: AppConfig, profile: str) -> EngineFlags:
    """Return the profile's flags with the configuration's own engine.flags on top."""
    base = cfg.profiles.get(profile, EngineFlags())
    return base.merged(cfg.engine.flags)


def engine_python(cfg: AppConfig) -> str:
    """Return the interpreter that runs the engine (configured, the engine venv, or our own)."""
    if cfg.engine.python:
        return str(Path(cfg.engine.python).expanduser())
    if ENGINE_VENV_PYTHON.exists():
        return str(ENGINE_VENV_PYTHON)
    return sys.executable


def check_vllm_installed(python: str) -> None:
    """Raise EngineNotInstalledError unless `python` can import vllm (without importing it)."""
    if not has_package(python, "vllm"):
        raise EngineNotInstalledError(
            f"vLLM is not installed for {python}.",
            "Run `make setup` (it installs vllm-cpu into .venv-engine), or set engine.python "
            "in config/backend.yaml to an interpreter that has vllm.",
        )


def vllm_args(flags: EngineFlags, engine: str) -> list[str]:
    """Turn engine flags into vLLM command-line arguments."""
    args: list[str] = []
    for name, flag in VLLM_FLAGS.items():
        value = getattr(flags, name)
        if value is None or (engine == "vllm-cpu" and name in CPU_ONLY_FLAGS):
            continue
        if isinstance(value, bool):
            if value:
                args.append(flag)
        else:
            args += [flag, str(value)]
    return args + list(flags.extra_args)


def external_launch(cfg: AppConfig, api_key: str) -> LaunchSpec:
    """Describe an already running OpenAI-compatible server (or vLLM fleet) at server.base_url."""
    url = cfg.server.base_url
    if not url:
        raise ConfigError(
            "engine.name is external but server.base_url is empty.",
            "Set server.base_url to the server's address, e.g. http://10.0.0.5:8000/v1.",
        )
    root = url.rstrip("/").removesuffix("/v1")
    return LaunchSpec(
        engine="external",
        argv=[],
        env={},
        host="",
        port=0,
        served_name=cfg.model.served_name,
        api_key=api_key,
        url=root,
    )


def build_launch(
    cfg: AppConfig,
    engine: str,
    model: str,
    port: int,
    api_key: str,
    python: str | None = None,
    flags: EngineFlags | None = None,
) -> LaunchSpec:
    """Build the argument list and environment that start `engine` serving `model` on `port`."""
    if engine == "trtllm":
        flags = flags or effective_flags(cfg, choose_profile(cfg, engine))
        serve = trtllm.find_tool(python or engine_python(cfg), trtllm.SERVE) or trtllm.SERVE
        return LaunchSpec(
            engine=engine,
            argv=[serve, trtllm.serve_target(cfg, model), *trtllm.serve_args(cfg, model, port, flags)],
            env=trtllm.serve_env(model),
            host=cfg.server.host,
            port=port,
            served_name=cfg.model.served_name,
            api_key=api_key,  # trtllm-serve checks no key; it listens on loopback only
            flags=flags.merged(EngineFlags(max_model_len=trtllm.max_seq_len(cfg, flags))),
        )
    if engine not in ("vllm", "vllm-cpu"):
        raise ConfigError(f"Engine {engine!r} cannot be started by this app.", "Use vllm or vllm-cpu.")
    flags = flags or effective_flags(cfg, choose_profile(cfg, engine))
    # On a GPU the `serve` entry point: only it runs --data-parallel-size and --api-server-count.
    # vllm-cpu's `serve` fails on its own package name (vllm-cpu, not vllm): it gets the API server module.
    if engine == "vllm":
        entry = ["vllm.entrypoints.cli.main", "serve", model]
    else:
        entry = ["vllm.entrypoints.openai.api_server", "--model", model]
    argv = [
        python or engine_python(cfg),
        "-m",
        *entry,
        "--served-model-name",
        cfg.model.served_name,
        "--host",
        cfg.server.host,
        "--port",
        str(port),
        "--disable-uvicorn-access-log",
    ]
    if cfg.model.load_format != "auto":
        argv += ["--load-format", cfg.model.load_format]
    argv += vllm_args(flags, engine)
    env = {
        **os.environ,
        "VLLM_API_KEY": api_key,  # by environment, so the key never shows in `ps` or the log
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    }
    if Path(model).exists():
        env["HF_HUB_OFFLINE"] = "1"
    if engine == "vllm-cpu" and flags.cpu_kvcache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(flags.cpu_kvcache_space_gib)
    return LaunchSpec(
        engine=engine,
        argv=argv,
        env=env,
        host=cfg.server.host,
        port=port,
        served_name=cfg.model.served_name,
        api_key=api_key,
        flags=flags,
    )
