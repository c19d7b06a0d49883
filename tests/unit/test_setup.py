"""The README's first command on a machine whose pip sees PyPI but not the local torch wheel: the Makefile
takes torch 2.13.0+cpu from PyTorch's CPU wheel index there, and asks no such index where pip finds it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from backend.config import ROOT

TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def make(flag: str, target: Path, venv: Path, env: dict[str, str]) -> str:
    """Run `make FLAG TARGET` for an engine environment at `venv`; its standard output (the run must succeed)."""
    proc = subprocess.run(
        ["make", flag, str(target), f"ENGINE_VENV={venv}", "PYTHON=python3"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def torch_index_choice(venv: Path, env: dict[str, str]) -> str:
    """Run the Makefile's own decision (target <venv>/.torch-index) and return what it wrote."""
    out = make("-s", venv / ".torch-index", venv, env)
    return (venv / ".torch-index").read_text().strip() + "\n" + out


@pytest.mark.slow
def test_pypi_alone_gets_torch_from_pytorchs_cpu_index(tmp_path: Path) -> None:
    # pip's configuration here adds a local wheel folder and local indexes; a machine elsewhere has none.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    chosen = torch_index_choice(tmp_path / "venv", env)
    assert chosen.startswith(f"--extra-index-url {TORCH_INDEX}\n"), chosen
    assert "taking it from PyTorch's CPU wheel index" in chosen


@pytest.mark.slow
def test_a_machine_that_carries_the_wheel_asks_no_extra_index(tmp_path: Path) -> None:
    chosen = torch_index_choice(tmp_path / "venv", dict(os.environ))
    assert chosen.startswith("\n") and "found by pip as configured" in chosen, chosen
