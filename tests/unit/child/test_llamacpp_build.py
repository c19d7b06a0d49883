"""backend/child/llamacpp_build.py fetches llama.cpp's sources quickly: only llama-cpp-python itself comes as source;
its build dependencies come as wheels (pip built every one of them from source before, ninja included: 11-18 of the
image's 32 minutes on 2 cores)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, TextIO

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
        for name, found, _ in llamacpp_build.SOURCE_FIXES:  # the texts the fixes change (the test below)
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_text(found)
        return src

    def cmake(cmd: list[str], sink: TextIO, log: Path) -> None:
        if "--build" in cmd:
            build_dir = Path(cmd[cmd.index("--build") + 1])
            seen.append((build_dir / "ggml.o").is_file())
            (build_dir / "ggml.o").write_text("compiled")
            if len(seen) == 1:
                raise SystemExit("stopped half way")
            (build_dir / "bin").mkdir()
            for name in ("llama-server", "llama-quantize", "libllama.so", "libggml-cpu-x64.so"):
                (build_dir / "bin" / name).write_text(name)
        else:
            Path(cmd[cmd.index("-B") + 1]).mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr(llamacpp_build, "fetch_sources", fetch)
    monkeypatch.setattr(llamacpp_build, "run_logged", cmake)
    out = tmp_path / "0.3.36-key"
    with pytest.raises(SystemExit):
        llamacpp_build.build(None, out, 2)
    llamacpp_build.build(None, out, 2)
    assert len(fetched) == 1, "the sources were fetched once"
    assert seen == [False, True], "the second compile found the first one's objects"
    assert (out / "bin" / "llama-server").is_file() and (out / "bin" / "cpu" / "libggml-cpu-x64.so").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name, f"{out.name}.log"], "the result and its log"


# A build step's output as Ninja writes it, line by line (flushed: whatever PYTHONUNBUFFERED says), with a compiler
# warning after every step (g++ 12 on AVX-512 kernels).
STEPS = """
import sys
print("-- The C compiler identification is GNU 12.2.0")
for i in range(1, 41):
    print(f"[{i}/40] Building CXX object ggml/src/kernel{i}.cpp.o", flush=True)
    print("avx512fintrin.h:5946:10: warning: '__Y' is used uninitialized", file=sys.stderr, flush=True)
sys.exit(int(sys.argv[1]))
"""


def test_a_build_step_shows_its_progress_and_keeps_the_compilers_output_in_its_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first `make run` on an AVX-512 machine printed ~80,000 lines of g++'s warnings about its own headers."""
    log = tmp_path / "build.log"
    with log.open("w") as sink:
        llamacpp_build.run_logged([sys.executable, "-c", STEPS, "0"], sink, log)
    shown = capsys.readouterr().out.splitlines()
    assert shown == [f"  llama.cpp: {p} % compiled" for p in range(10, 101, 10)], shown
    kept = log.read_text()
    lines = kept.splitlines()
    assert sum(line.startswith("avx512fintrin.h") for line in lines) == 40, "every warning"
    assert "[40/40] Building CXX object ggml/src/kernel40.cpp.o" in lines and "GNU 12.2.0" in kept


def test_a_failed_build_step_shows_its_last_lines_and_where_the_rest_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "build.log"
    with log.open("w") as sink, pytest.raises(SystemExit) as failed:
        llamacpp_build.run_logged([sys.executable, "-c", STEPS, "3"], sink, log)
    assert "exit code 3" in str(failed.value) and str(log) in str(failed.value), failed.value
    out = capsys.readouterr().out
    assert "[40/40] Building" in out and "warning: '__Y'" in out, "the end of the output, where the error is"
    assert "[1/40] Building" not in out, "only its end"


@pytest.mark.parametrize(
    ("line", "percent"),
    [
        ("[141/292] Building CXX object src/llama.cpp.o", 48),
        ("[ 45%] Building CXX object src/llama.cpp.o", 45),
        ("[100%] Linking CXX executable bin/llama-server", 100),
        ("/usr/lib/gcc/x86_64-linux-gnu/12/include/avx512fintrin.h:5946:10: warning: ...", None),
        ("  [1/2] not at the start", None),
    ],
)
def test_progress_is_read_from_ninjas_and_makes_lines(line: str, percent: int | None) -> None:
    assert llamacpp_build.progress_percent(line) == percent


def test_source_fixes_apply_once_and_a_changed_source_stops_the_build_saying_which(tmp_path: Path) -> None:
    """Each fix is applied to the text it names; where a new llama.cpp changed that text, the build stops at once
    with the file's name instead of building without the fix (the AMX one: a SIGILL at the first prompt)."""
    for name, found, _ in llamacpp_build.SOURCE_FIXES:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"before\n{found}after\n")
    llamacpp_build.fix_sources(tmp_path)
    for name, _, replacement in llamacpp_build.SOURCE_FIXES:
        assert (tmp_path / name).read_text() == f"before\n{replacement}after\n"
    name, found, _ = llamacpp_build.SOURCE_FIXES[0]
    (tmp_path / name).write_text("a llama.cpp whose text moved on\n")
    with pytest.raises(SystemExit, match=name):
        llamacpp_build.fix_sources(tmp_path)
