"""What accelerator this machine has, read from nvidia-smi or a Jetson's system files (the one boundary
tests may fake: they feed the parse_* functions the text those sources print)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

QUERY_FIELDS = "name,memory.total,compute_cap"
# Drivers older than 510 do not know compute_cap; they are asked for the first two fields only.
LEGACY_QUERY_FIELDS = "name,memory.total"
TEGRA_RELEASE = Path("/etc/nv_tegra_release")
DEVICE_TREE_MODEL = Path("/proc/device-tree/model")
MEMINFO = Path("/proc/meminfo")
CPUINFO = Path("/proc/cpuinfo")

_CC = re.compile(r"(\d+)\.(\d+)")
# Jetson modules by family: compute capability of their integrated GPU.
_JETSON_CC = {"orin": (8, 7), "xavier": (7, 2), "tx2": (6, 2), "nano": (5, 3)}


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_mib: int
    compute_capability: tuple[int, int] | None = None  # None: the driver did not say
    unified_memory: bool = False  # Jetson: the GPU shares the system RAM with the CPU

    @property
    def cc_text(self) -> str:
        """Compute capability as nvidia-smi writes it ("8.9"), or "unknown"."""
        return "unknown" if self.compute_capability is None else "{}.{}".format(*self.compute_capability)


def gpu_label(gpus: list[Gpu]) -> str:
    """How the chat names the GPUs an engine may use: "H200", "2 x H200", "H100 80GB HBM3 + A100-SXM4-40GB"."""
    names = [g.name.removeprefix("NVIDIA ").strip() or "GPU" for g in gpus]
    if not names:
        return "GPU"
    if len(set(names)) == 1:
        return names[0] if len(names) == 1 else f"{len(names)} x {names[0]}"
    return " + ".join(names)


def _run_smi(exe: str, fields: str, timeout_s: float) -> str:
    return subprocess.run(
        [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
    ).stdout


def detect_gpus(timeout_s: float = 10.0) -> list[Gpu]:
    """List the NVIDIA GPUs CUDA will see (nvidia-smi, else a Jetson's own GPU); empty when there is none."""
    exe = shutil.which("nvidia-smi")
    gpus: list[Gpu] = []
    if exe is not None:
        try:
            try:
                out = _run_smi(exe, QUERY_FIELDS, timeout_s)
            except subprocess.CalledProcessError:
                out = _run_smi(exe, LEGACY_QUERY_FIELDS, timeout_s)
            gpus = visible_gpus(parse_nvidia_smi(out), os.environ.get("CUDA_VISIBLE_DEVICES"))
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("nvidia-smi failed (%s); assuming no discrete GPU", exc)
    if gpus:
        return gpus
    jetson = detect_jetson()
    return [jetson] if jetson else []


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Parse `nvidia-smi --query-gpu=name,memory.total[,compute_cap] --format=csv,noheader,nounits` output."""
    gpus = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        cc: tuple[int, int] | None = None
        if len(parts) >= 3 and parts[-2].isdigit() and (match := _CC.fullmatch(parts[-1])):
            cc = (int(match.group(1)), int(match.group(2)))
            name, memory = ",".join(parts[:-2]), parts[-2]
        elif len(parts) >= 2 and parts[-1].isdigit():
            name, memory = ",".join(parts[:-1]), parts[-1]
        else:
            continue  # "[N/A]" memory (a Jetson's nvidia-smi) or a line that is not a GPU
        if name:
            gpus.append(Gpu(name=name, memory_mib=int(memory), compute_capability=cc))
    return gpus


def visible_gpus(gpus: list[Gpu], cuda_visible_devices: str | None) -> list[Gpu]:
    """Keep the GPUs CUDA_VISIBLE_DEVICES names by index (unset, or UUIDs we cannot map, keep them all).

    Indices are taken in nvidia-smi's (PCI bus) order, CUDA's own with CUDA_DEVICE_ORDER=PCI_BUS_ID; on a
    machine with mixed GPUs CUDA's default fastest-first order can differ.
    """
    if cuda_visible_devices is None:
        return gpus
    wanted = [item.strip() for item in cuda_visible_devices.split(",")]
    if any(item and not item.lstrip("-").isdigit() for item in wanted):
        return gpus
    kept = []
    for item in wanted:
        # CUDA stops at the first index that is empty, negative or out of range ("" and "-1" hide all).
        if not item.isdigit() or int(item) >= len(gpus):
            break
        kept.append(gpus[int(item)])
    return kept


def parse_jetson(model_text: str, meminfo_text: str, is_tegra: bool = False) -> Gpu | None:
    """Describe a Jetson's integrated GPU from its device-tree model name and /proc/meminfo, else None."""
    name = model_text.replace("\x00", "").strip()
    lowered = name.lower()
    if not is_tegra and "jetson" not in lowered:
        return None
    cc = next((value for family, value in _JETSON_CC.items() if family in lowered), None)
    match = re.search(r"^MemTotal:\s+(\d+)\s*kB", meminfo_text, re.MULTILINE)
    memory_mib = int(match.group(1)) // 1024 if match else 0
    return Gpu(name=name or "NVIDIA Jetson", memory_mib=memory_mib, compute_capability=cc, unified_memory=True)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def detect_jetson() -> Gpu | None:
    """Return the Jetson's GPU when this machine is one (L4T release file or device-tree model), else None."""
    return parse_jetson(_read(DEVICE_TREE_MODEL), _read(MEMINFO), is_tegra=TEGRA_RELEASE.exists())


def parse_cpu_flags(cpuinfo_text: str) -> set[str]:
    """The instruction-set flags of the first CPU in /proc/cpuinfo text (x86 "flags", Arm "Features")."""
    match = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", cpuinfo_text, re.MULTILINE)
    return set(match.group(1).split()) if match else set()


def cpu_model() -> str:
    """This machine's CPU model as `lscpu` names it ("AMD EPYC", "Intel(R) Xeon(R) Processor"), recorded beside every
    CPU figure; /proc/cpuinfo's model name where lscpu is missing; "unknown CPU" where neither says."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for text, label in ((out, "Model name"), (_read(CPUINFO), "model name")):
        for line in text.splitlines():
            if line.startswith(label) and ":" in line and line.split(":", 1)[1].strip():
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def detect_cpu_flags() -> set[str]:
    """This machine's CPU flags (empty when /proc/cpuinfo cannot be read)."""
    return parse_cpu_flags(_read(CPUINFO))


def cpu_identity() -> tuple[str, set[str]]:
    """/proc/cpuinfo's model name of the first CPU ("unknown CPU" where it has none) and its flags: what a cached
    verdict or tune holds for (backend.serving.verdicts.cpu_signature)."""
    text = _read(CPUINFO)
    match = re.search(r"^model name[ \t]*:[ \t]*(\S.*)$", text, re.MULTILINE)
    return (match.group(1).strip() if match else "unknown CPU"), parse_cpu_flags(text)
