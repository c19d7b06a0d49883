"""What accelerator this machine has, read from nvidia-smi (the one boundary tests may fake)."""

from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_mib: int


def detect_gpus(timeout_s: float = 10.0) -> list[Gpu]:
    """List the NVIDIA GPUs that nvidia-smi reports; empty when there is none or it fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("nvidia-smi failed (%s); assuming no GPU", exc)
        return []
    return parse_nvidia_smi(out)


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Parse `nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits` output."""
    gpus = []
    for line in text.splitlines():
        name, _, memory = line.rpartition(",")
        if name.strip() and memory.strip().isdigit():
            gpus.append(Gpu(name=name.strip(), memory_mib=int(memory.strip())))
    return gpus
