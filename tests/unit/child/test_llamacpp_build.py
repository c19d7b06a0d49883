"""backend/child/llamacpp_build.py fetches llama.cpp's sources quickly: only llama-cpp-python itself comes as source;
its build dependencies come as wheels (pip built every one of them from source before, ninja included: 11-18 of the
image's 32 minutes on 2 cores)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from backend.child import llamacpp_build


def test_only_llama_cpp_python_itself_is_fetched_as_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commands: list[list[str]] = []

    def download(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        commands.append(cmd)
        (tmp_path / f"llama_cpp_python-{llamacpp_build.VERSION}.tar.gz").write_bytes(b"")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(llamacpp_build.subprocess, "run", download)
    monkeypatch.setattr(llamacpp_build, "unpack", lambda archive, dest: None)
    llamacpp_build.fetch_sources(tmp_path)
    [cmd] = commands
    assert cmd[cmd.index("--no-binary") + 1] == "llama-cpp-python", cmd
    assert ":all:" not in cmd and f"llama-cpp-python=={llamacpp_build.VERSION}" in cmd
