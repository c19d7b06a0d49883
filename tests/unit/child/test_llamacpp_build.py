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


def test_a_build_stopped_half_way_goes_on_where_it_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in `make setup`, or a container build cancelled, keeps what was compiled: the next build neither fetches
    the sources again nor starts the compile from nothing; a finished build leaves only its result."""
    fetched: list[Path] = []
    seen: list[bool] = []  # per compile: whether the objects of the one before were still there

    def fetch(work: Path) -> Path:
        fetched.append(work)
        src = work / f"llama_cpp_python-{llamacpp_build.VERSION}" / "vendor" / "llama.cpp"
        src.mkdir(parents=True)
        return src

    def cmake(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        if "--build" in cmd:
            build_dir = Path(cmd[cmd.index("--build") + 1])
            seen.append((build_dir / "ggml.o").is_file())
            (build_dir / "ggml.o").write_text("compiled")
            if len(seen) == 1:
                raise subprocess.CalledProcessError(130, cmd)  # stopped half way
            (build_dir / "bin").mkdir()
            for name in ("llama-server", "llama-quantize", "libllama.so", "libggml-cpu-x64.so"):
                (build_dir / "bin" / name).write_text(name)
        else:
            Path(cmd[cmd.index("-B") + 1]).mkdir(parents=True, exist_ok=True)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(llamacpp_build, "fetch_sources", fetch)
    monkeypatch.setattr(llamacpp_build.subprocess, "run", cmake)
    out = tmp_path / "0.3.36-key"
    with pytest.raises(subprocess.CalledProcessError):
        llamacpp_build.build(None, out, 2)
    llamacpp_build.build(None, out, 2)
    assert len(fetched) == 1, "the sources were fetched once"
    assert seen == [False, True], "the second compile found the first one's objects"
    assert (out / "bin" / "llama-server").is_file() and (out / "bin" / "cpu" / "libggml-cpu-x64.so").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name], "nothing but the result is left"
