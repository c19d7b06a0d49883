"""Build llama.cpp's own C++ server (llama-server, llama-quantize) from the sources on the package index.

    python -m backend.child.llamacpp_build [--prefix DIR] [--variants native|ladder|all] [--jobs N]

No binary is downloaded: the llama-cpp-python sdist on PyPI vendors the whole of llama.cpp
(`tools/server/` included), and pip fetches that sdist like any other package. It is built with CMake
with `GGML_BACKEND_DL`: the CPU kernels are separate libraries, one per instruction-set level
("variant": x64, haswell, skylakex, zen4, sapphirerapids...), and the app chooses one at run time
(GGML_BACKEND_PATH, see backend.engines.llamacpp). That is how a machine that advertises AMX but faults on it
(a Firecracker VM, 2026-12-01) is served by the AVX-512 kernels instead: the canary
(backend.serving.canary) tries the best variant the CPU claims first and falls back on a crash or a mismatch.

`--variants native` (the default, what `make setup-llamacpp` builds) compiles only the variants this
CPU claims among a short ladder, plus the portable x64 one (~10 minutes on 2 cores); `ladder` compiles the whole
ladder, for an image meant for other CPUs (every variant the app chooses among: it tries those outside the ladder
only after x64, which runs anywhere); `all` compiles llama.cpp's whole list (14 on x86: 12.7 minutes on 2 cores).
Off x86, both build llama.cpp's own list. The result is cached per version and variant list under
~/.cache/ernie-chat/llama.cpp (like pip's wheel cache) and linked into the prefix.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections import deque
from pathlib import Path
from typing import TextIO

VERSION = "0.3.36"  # llama-cpp-python's sdist; its vendor/llama.cpp is what gets built
BUILD_REVISION = 2  # bump when the CMake options or the source fixes below change
TARGETS = ("llama-server", "llama-quantize")
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_BACKEND_DL=ON",
    "-DGGML_CPU_ALL_VARIANTS=ON",
    "-DBUILD_SHARED_LIBS=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_CCACHE=OFF",
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    "-DCMAKE_INSTALL_RPATH=$ORIGIN",
)
# Fixes to llama.cpp's sources before building: (file under vendor/llama.cpp, text found once, its replacement).
# AMX's tile configuration: GCC 12 (Debian 12's) drops the stores that fill the `tc` on the stack before
# `_tile_loadconfig(&tc)` reads it (it does not see the builtin read them), so the tiles stay unconfigured and the
# first tile instruction faults: SIGILL at `tilezero` in tinygemm_kernel_amx, the first matrix product of a
# prompt (gdb, Intel Xeon, 2026-12-07; GCC 14 keeps the stores; llama.cpp PR 26954 moves tc off the stack). An
# empty asm that takes tc's address and clobbers memory keeps the stores with any compiler.
SOURCE_FIXES: tuple[tuple[str, str, str], ...] = (
    (
        "ggml/src/ggml-cpu/amx/mmq.cpp",
        "    _tile_loadconfig(&tc);\n",
        '    asm volatile("" : : "r"(&tc) : "memory");  // keeps the stores to tc (SOURCE_FIXES)\n'
        "    _tile_loadconfig(&tc);\n",
    ),
)
# The x86 ladder built for "native", best first, with the /proc/cpuinfo flags each needs (llama.cpp's
# own feature sets, ggml/src/CMakeLists.txt); x64 runs anywhere and is always built.
AVX512 = ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")
LADDER: dict[str, tuple[str, ...]] = {
    "sapphirerapids": (*AVX512, "avx512vbmi", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8"),
    "zen4": (*AVX512, "avx512vbmi", "avx512_vnni", "avx512_bf16"),
    "skylakex": AVX512,
    "haswell": ("avx", "avx2", "fma", "f16c", "bmi2"),
    "x64": (),
}
VARIANT_LINE = re.compile(r"^(\s*)ggml_add_cpu_backend_variant\((\w+)\b", re.MULTILINE)
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ernie-chat" / "llama.cpp"


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The instruction-set flags the CPU advertises (the first `flags` line of /proc/cpuinfo)."""
    text = cpuinfo if cpuinfo is not None else Path("/proc/cpuinfo").read_text(errors="replace")
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def claimed_variants(flags: set[str]) -> list[str]:
    """The ladder's variants whose instructions the CPU advertises, best first (x64 always last)."""
    return [name for name, needs in LADDER.items() if set(needs) <= flags]


def keep_variants(cmakelists: str, keep: set[str]) -> str:
    """llama.cpp's ggml/src/CMakeLists.txt with only the `keep` x86 CPU variants left in its variant list."""
    start = cmakelists.index('if (GGML_SYSTEM_ARCH STREQUAL "x86")', cmakelists.index("if (GGML_CPU_ALL_VARIANTS)"))
    end = cmakelists.index("elseif", start)
    block = cmakelists[start:end]
    found = {m.group(2) for m in VARIANT_LINE.finditer(block)}
    if not keep <= found:
        raise SystemExit(f"llama.cpp {VERSION}'s CMakeLists.txt has no CPU variant(s) {sorted(keep - found)}")

    def drop(match: re.Match[str]) -> str:
        return match.group(0) if match.group(2) in keep else f"{match.group(1)}# not built here: {match.group(2)}"

    # The whole call is commented out: the name, its feature list and the closing parenthesis.
    block = re.sub(r"^(\s*)ggml_add_cpu_backend_variant\((\w+)\b[^)]*\)", drop, block, flags=re.MULTILINE)
    return cmakelists[:start] + block + cmakelists[end:]


def unpack(archive: Path, dest: Path) -> None:
    """Unpack a source archive into `dest`, refusing any member that would land outside it (links included)."""
    root = dest.resolve()

    def inside(path: str) -> bool:
        return Path(os.path.realpath(path)).is_relative_to(root)

    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        for member in members:
            target = os.path.join(root, member.name)
            link = os.path.join(os.path.dirname(target) if member.issym() else root, member.linkname)
            if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
                raise SystemExit(f"{archive.name}: {member.name} is neither a file, a folder nor a link")
            if not inside(target) or ((member.issym() or member.islnk()) and not inside(link)):
                raise SystemExit(f"{archive.name}: {member.name} would be unpacked outside {dest}")
        # `filter` came in Python 3.11.4 (Debian 12 has 3.11.2): the checks above hold either way, and where it
        # exists it also drops what a source archive needs not keep (owners, set-uid bits), and 3.12+ warns without.
        if hasattr(tarfile, "data_filter"):
            tar.extractall(root, members, filter="data")
        else:
            tar.extractall(root, members)


def fix_sources(src: Path) -> None:
    """Apply SOURCE_FIXES to the llama.cpp tree `src`; SystemExit, saying which, when one no longer applies."""
    for name, found, replacement in SOURCE_FIXES:
        path = src / name
        text = path.read_text() if path.is_file() else ""
        if text.count(found) != 1:
            raise SystemExit(
                f"llama.cpp's {name} changed in llama-cpp-python {VERSION}: the source fix for it no longer applies "
                "(backend/child/llamacpp_build.py, SOURCE_FIXES): check whether it is still needed and update it."
            )
        path.write_text(text.replace(found, replacement))


def fetch_sources(work: Path) -> Path:
    """Download llama-cpp-python's sdist from the package index and unpack it; return vendor/llama.cpp."""
    # Only llama-cpp-python itself as source: its build dependencies (scikit-build-core, ninja...) come as wheels.
    # `--no-binary :all:` made pip build each of them from source first (11-18 min on 2 cores), ninja included.
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python", "-q", "-d",
         str(work), f"llama-cpp-python=={VERSION}"],
        check=True,
    )  # fmt: skip
    archive = next(work.glob("llama_cpp_python-*.tar.gz"))
    unpack(archive, work)
    archive.unlink()
    return work / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"


# A build step's progress: Ninja's "[141/292] Building ..." or Make's "[ 45%] Building ...".
STEP = re.compile(r"^\[\s*(?:(\d+)/(\d+)|(\d+)%)\]")
FAILED_TAIL = 40  # lines of the log shown when a step fails


def progress_percent(line: str) -> int | None:
    """How far the build is, from one of its output lines; None where the line says nothing of it."""
    step = STEP.match(line)
    if step is None:
        return None
    done, total, percent = step.groups()
    return int(percent) if percent is not None else 100 * int(done) // max(1, int(total))


def run_logged(cmd: list[str], sink: TextIO, log: Path, every: int = 10) -> None:
    """Run one build step with its whole output in the log and its progress on the console, a line each `every` %.

    On an AVX-512 machine g++ 12 warns ~80,000 lines about its own intrinsics headers while compiling llama.cpp's
    kernels (-Wmaybe-uninitialized, harmless): printed, they buried `make run`'s own lines. A step that fails shows
    the end of its output and where the rest is."""
    sink.write(f"$ {' '.join(cmd)}\n")
    sink.flush()
    shown = 0
    tail: deque[str] = deque(maxlen=FAILED_TAIL)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace") as proc:
        for line in proc.stdout or ():
            sink.write(line)
            tail.append(line)
            percent = progress_percent(line)
            if percent is not None and percent >= shown + every:
                shown = percent - percent % every
                print(f"  llama.cpp: {shown} % compiled", flush=True)
    if proc.returncode:
        sys.stdout.writelines(tail)
        raise SystemExit(f"llama.cpp's build failed ({cmd[0]} exit code {proc.returncode}); its whole output: {log}")


def build(variants: list[str] | None, out: Path, jobs: int) -> None:
    """Configure and build into `out` (bin/ with the programs, bin/cpu/ with one library per variant). The sources and
    the build tree stay beside it (`out`.work) until the build is done: one stopped half way (Ctrl-C, a time limit, a
    container build cancelled) goes on from where it stopped the next time, instead of compiling everything again."""
    work = out.with_name(out.name + ".work")
    src = work / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
    if not (work / ".unpacked").is_file():
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        fetch_sources(work)
        fix_sources(src)
        if variants is not None:
            lists = src / "ggml" / "src" / "CMakeLists.txt"
            lists.write_text(keep_variants(lists.read_text(), set(variants)))
        (work / ".unpacked").touch()
    ninja = shutil.which("ninja") is not None  # Debian's ninja-build, where installed
    build_dir = work / ("build-ninja" if ninja else "build-make")  # a build tree keeps the generator it began with
    generator = ["-G", "Ninja"] if ninja else []
    log = out.with_name(out.name + ".log")
    print(f"The compiler's whole output goes to {log}", flush=True)
    with log.open("w") as sink:
        run_logged(["cmake", "-S", str(src), "-B", str(build_dir), *generator, *CMAKE_OPTIONS], sink, log)
        run_logged(["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", *TARGETS], sink, log)
    staged = out.with_name(out.name + ".partial")
    shutil.rmtree(staged, ignore_errors=True)
    (staged / "bin" / "cpu").mkdir(parents=True)
    for path in (build_dir / "bin").iterdir():
        if path.name.startswith("libggml-cpu-") and path.suffix == ".so":
            # Kept out of bin/ so that llama.cpp's own search (the program's folder) finds none of them
            # and loads exactly the one GGML_BACKEND_PATH names.
            shutil.copy2(path, staged / "bin" / "cpu" / path.name)
        elif path.name in TARGETS or ".so" in path.name:
            shutil.copy2(path, staged / "bin" / path.name, follow_symlinks=False)
    (staged / "VERSION").write_text(f"llama-cpp-python {VERSION} vendor/llama.cpp\n")
    shutil.rmtree(out, ignore_errors=True)
    staged.rename(out)
    shutil.rmtree(work)


def cache_dir(variants: list[str] | None) -> Path:
    """Where this version and variant list is built once (shared by every checkout on the machine)."""
    key = hashlib.sha256(f"{VERSION} {BUILD_REVISION} {variants} {CMAKE_OPTIONS} {SOURCE_FIXES}".encode()).hexdigest()
    key = key[:10]
    return CACHE / f"{VERSION}-{key}"


def main(argv: list[str] | None = None) -> int:
    """Build (or reuse the cached build of) llama-server and link it to PREFIX."""
    parser = argparse.ArgumentParser(prog="python -m backend.child.llamacpp_build", description=main.__doc__)
    parser.add_argument("--prefix", type=Path, default=Path(".venv-engine") / "llama.cpp")
    parser.add_argument("--variants", choices=("native", "ladder", "all"), default="native")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--rebuild", action="store_true", help="ignore the cached build")
    args = parser.parse_args(argv)
    chosen = {"native": claimed_variants(cpu_flags()), "ladder": list(LADDER), "all": None}
    variants = chosen[args.variants]
    if variants is not None and os.uname().machine not in ("x86_64", "AMD64"):
        variants = None  # llama.cpp's list for other architectures (ARM) is used whole
    target = cache_dir(variants)
    if args.rebuild:
        shutil.rmtree(target.with_name(target.name + ".work"), ignore_errors=True)
    if args.rebuild or not (target / "bin" / "llama-server").is_file():
        started = time.monotonic()
        print(f"Building llama.cpp's server (variants: {', '.join(variants or ['all'])}) into {target}", flush=True)
        build(variants, target, args.jobs)
        print(f"Built in {time.monotonic() - started:.0f} s", flush=True)
    prefix: Path = args.prefix
    if prefix.is_symlink() or prefix.is_file():
        prefix.unlink()
    elif prefix.is_dir():
        shutil.rmtree(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.symlink_to(target.resolve(), target_is_directory=True)
    print(f"{prefix} -> {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
