"""Hardware detection: the text nvidia-smi and a Jetson's system files print, parsed."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from backend.serving import hardware
from backend.serving.hardware import Gpu, gpu_label, parse_cpu_flags, parse_jetson, parse_nvidia_smi, visible_gpus
from backend.serving.verdicts import cpu_signature


def test_parse_with_compute_capability() -> None:
    text = "NVIDIA H200, 143771, 9.0\nTesla T4, 15360, 7.5\n"
    assert parse_nvidia_smi(text) == [
        Gpu("NVIDIA H200", 143771, (9, 0)),
        Gpu("Tesla T4", 15360, (7, 5)),
    ]


def test_parse_legacy_two_columns_and_commas_in_names() -> None:
    assert parse_nvidia_smi("NVIDIA A100-SXM4-40GB, 40960\nOdd, Name, 8192, 8.6\n") == [
        Gpu("NVIDIA A100-SXM4-40GB", 40960, None),
        Gpu("Odd,Name", 8192, (8, 6)),
    ]


def test_parse_skips_lines_without_memory() -> None:
    # A Jetson's nvidia-smi (JetPack 6) reports no dedicated memory.
    assert parse_nvidia_smi("Orin (nvgpu), [N/A], 8.7\n\nNo devices were found\n") == []


def test_cuda_visible_devices() -> None:
    gpus = parse_nvidia_smi("A, 100, 8.0\nB, 200, 8.0\nC, 300, 8.0")
    assert [g.name for g in visible_gpus(gpus, None)] == ["A", "B", "C"]
    assert [g.name for g in visible_gpus(gpus, "2,0")] == ["C", "A"]
    assert visible_gpus(gpus, "") == []
    assert visible_gpus(gpus, "-1") == []
    assert [g.name for g in visible_gpus(gpus, "1,7,0")] == ["B"]  # CUDA stops at the first bad index
    assert len(visible_gpus(gpus, "GPU-5c1e7d3e-aaaa")) == 3  # UUIDs: cannot map, keep all


def test_jetson_from_device_tree() -> None:
    gpu = parse_jetson(
        "NVIDIA Jetson Orin NX Engineering Reference Developer Kit\x00",
        "MemTotal:       15655312 kB\nMemFree: 1 kB\n",
    )
    assert gpu == Gpu("NVIDIA Jetson Orin NX Engineering Reference Developer Kit", 15288, (8, 7), unified_memory=True)


def test_not_a_jetson() -> None:
    assert parse_jetson("", "MemTotal: 100 kB") is None
    assert parse_jetson("Raspberry Pi 5 Model B", "MemTotal: 100 kB") is None
    # a Tegra machine without a device-tree model name is still one: the family name, its memory, no known cc
    tegra = parse_jetson("", "MemTotal: 8000000 kB", is_tegra=True)
    assert tegra == Gpu("NVIDIA Jetson", 8000000 // 1024, None, unified_memory=True)


def test_cpu_flags() -> None:
    text = "processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    assert parse_cpu_flags(text) == {"fpu", "sse", "avx512f", "avx512_bf16"}
    assert parse_cpu_flags("Features\t: fp asimd bf16\n") == {"fp", "asimd", "bf16"}


def test_the_gpus_are_named_as_the_chat_shows_them() -> None:
    assert gpu_label(parse_nvidia_smi("NVIDIA H200, 143771, 9.0")) == "H200"
    assert gpu_label(parse_nvidia_smi("NVIDIA H200, 143771, 9.0\nNVIDIA H200, 143771, 9.0")) == "2 x H200"
    mixed = parse_nvidia_smi("NVIDIA H100 80GB HBM3, 81559, 9.0\nNVIDIA A100-SXM4-40GB, 40960, 8.0")
    assert gpu_label(mixed) == "H100 80GB HBM3 + A100-SXM4-40GB"
    assert gpu_label([]) == "GPU"


def test_the_cpu_model_is_lscpu_s_else_proc_cpuinfo_s(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Example CPU 9000\nflags\t\t: avx2\n")
    monkeypatch.setattr(hardware, "CPUINFO", cpuinfo)

    def lscpu(out: str) -> Any:
        return lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=out)

    monkeypatch.setattr(hardware.subprocess, "run", lscpu("Architecture: x86_64\nModel name:   AMD EPYC\n"))
    assert hardware.cpu_model() == "AMD EPYC"

    def missing(*args: Any, **kwargs: Any) -> Any:
        raise FileNotFoundError("lscpu")

    monkeypatch.setattr(hardware.subprocess, "run", missing)
    assert hardware.cpu_model() == "Example CPU 9000"
    cpuinfo.write_text("processor\t: 0\n")
    assert hardware.cpu_model() == "unknown CPU"


def test_a_cached_verdict_holds_for_the_cpu_model_and_its_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setattr(hardware, "CPUINFO", cpuinfo)
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: sse avx2\n\nprocessor\t: 1\nmodel name\t: X\n"
    )
    assert hardware.cpu_identity() == ("AMD EPYC", {"sse", "avx2"})
    same = cpu_signature()
    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t\t: avx2 sse\n")
    assert cpu_signature() == same and same.startswith("AMD EPYC ["), "the flags' order changes nothing"
    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t\t: sse avx2 avx512f\n")
    assert cpu_signature() != same, "another instruction set: verdicts are made again"
    cpuinfo.write_text("model name\t:\nflags\t\t: sse\n")
    assert hardware.cpu_identity() == ("unknown CPU", {"sse"})
    monkeypatch.setattr(hardware, "CPUINFO", tmp_path / "missing")
    assert hardware.cpu_identity() == ("unknown CPU", set())
