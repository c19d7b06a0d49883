"""Every Python the project promises (pyproject.toml's requires-python, which the README states) runs it: the oldest
one on this machine imports the whole backend, and every one found unpacks llama.cpp's sources as `make setup` does.
(Debian 12's own Python is 3.11.2, which has no `tarfile` `filter=`: `make setup` failed there while the
development machines' 3.11.7 passed every test.)"""

from __future__ import annotations

import ast
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from functools import cache
from pathlib import Path

import pytest

from backend.config import ROOT

SPEC = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]


def in_range(version: tuple[int, ...]) -> bool:
    """Whether `version` satisfies requires-python (its >= and < clauses, the only ones it uses)."""
    for op, number in re.findall(r"(>=|<)\s*([\d.]+)", SPEC):
        bound = tuple(int(part) for part in number.split("."))
        if (op == ">=" and version < bound) or (op == "<" and version >= bound):
            return False
    return True


@cache
def pythons() -> dict[tuple[int, int, int], str]:
    """The interpreters in the range found here (this one, the system's, python3.N on the PATH), by version."""
    names = [sys.executable, "/usr/bin/python3", *(f"python3.{minor}" for minor in range(11, 20))]
    found: dict[tuple[int, int, int], str] = {}
    for name in names:
        path = shutil.which(name)
        if path is None:
            continue
        proc = subprocess.run([path, "-c", "import sys; print(*sys.version_info[:3])"], capture_output=True,
                              text=True, timeout=30)  # fmt: skip
        if proc.returncode == 0:  # a pyenv shim for a version it lacks exits 127
            version = tuple(int(part) for part in proc.stdout.split())
            if in_range(version):
                found.setdefault((version[0], version[1], version[2]), path)
    return dict(sorted(found.items()))


def oldest() -> tuple[tuple[int, int, int], str]:
    return next(iter(pythons().items()))


def run(python: str, code: str, *args: str, strict: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -c code args` with the project importable; `strict`: warnings are errors (Python 3.12+ warns about
    unpacking without a filter)."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1", **env}
    return subprocess.run([python, *(["-W", "error"] if strict else []), "-c", code, *args], capture_output=True,
                          text=True, timeout=120, env=environ)  # fmt: skip


UNPACK = "import sys; from pathlib import Path; from backend.child.llamacpp_build import unpack; " \
         "unpack(Path(sys.argv[1]), Path(sys.argv[2]))"  # fmt: skip


def sdist(path: Path, extra: list[tuple[tarfile.TarInfo, bytes]] | None = None) -> Path:
    """An archive shaped like llama-cpp-python's sdist: folders, files and a link inside, plus `extra` members."""
    with tarfile.open(path, "w:gz") as tar:

        def add(info: tarfile.TarInfo, data: bytes = b"") -> None:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)

        base = "llama_cpp_python-0.3.36/vendor/llama.cpp"
        folder = tarfile.TarInfo(base)
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        add(folder)
        add(tarfile.TarInfo(f"{base}/CMakeLists.txt"), b"project(llama.cpp)\n")
        link = tarfile.TarInfo(f"{base}/README")
        link.type, link.linkname = tarfile.SYMTYPE, "CMakeLists.txt"
        add(link)
        for info, data in extra or []:
            add(info, data)
    return path


def test_pythons_in_the_range_are_found() -> None:
    assert pythons(), f"no interpreter here satisfies requires-python {SPEC}"
    assert in_range(sys.version_info[:3]), f"the test suite runs on Python {sys.version.split()[0]}, outside {SPEC}"
    assert in_range((3, 11, 0)) and not in_range((3, 10, 13)), "the README promises Python 3.11 onwards"


@pytest.mark.parametrize("version", list(pythons()), ids=lambda v: ".".join(map(str, v)))
def test_llamacpps_sources_unpack_on_each_python(version: tuple[int, int, int], tmp_path: Path) -> None:
    """backend.child.llamacpp_build runs under the engine's interpreter, which `make setup` makes from any of them."""
    proc = run(pythons()[version], UNPACK, str(sdist(tmp_path / "sdist.tar.gz")), str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    tree = tmp_path / "out" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
    assert (tree / "README").read_text() == "project(llama.cpp)\n"


@pytest.mark.parametrize(
    ("name", "kind", "target"),
    [("../../outside", tarfile.REGTYPE, ""), ("/tmp/absolute", tarfile.REGTYPE, ""),
     ("escape", tarfile.SYMTYPE, "../../outside"), ("etc", tarfile.SYMTYPE, "/etc"),
     ("hard", tarfile.LNKTYPE, "../outside"), ("null", tarfile.CHRTYPE, "")],
)  # fmt: skip
def test_an_archive_reaching_outside_is_refused_on_the_oldest_python(
    name: str, kind: bytes, target: str, tmp_path: Path
) -> None:
    """The oldest Python has no `filter="data"`: the project's own checks must refuse what that filter would."""
    bad = tarfile.TarInfo(f"llama_cpp_python-0.3.36/{name}" if not name.startswith("/") else name)
    bad.type, bad.linkname = kind, target
    archive = sdist(tmp_path / "bad.tar.gz", [(bad, b"x")])
    (tmp_path / "out").mkdir()
    proc = run(oldest()[1], UNPACK, str(archive), str(tmp_path / "out"))
    assert proc.returncode != 0 and ("outside" in proc.stderr or "neither" in proc.stderr), proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tar.gz", "out"] and not any((tmp_path / "out").iterdir())


IMPORT_ALL = """
import importlib, site, sys
from pathlib import Path
sys.path = [p for p in sys.path if "-packages" not in p]  # the system's own (Debian's dist-packages) are not the app's
site.addsitedir(sys.argv[1])
root = Path(sys.argv[2])
for path in sorted(root.rglob("*.py")):
    if any(part.startswith(".") for part in path.relative_to(root).parts):
        continue
    compile(path.read_text(encoding="utf-8"), str(path), "exec")  # every file's syntax, the tests' too
names = [".".join(p.relative_to(root).with_suffix("").parts) for p in sorted((root / "backend").rglob("*.py"))]
for name in names:
    if name.endswith("__main__") or (name.startswith("backend.child.") and name != "backend.child.llamacpp_build"):
        continue  # backend.child runs in the engine's environment (llamacpp_build: the standard library only)
    importlib.import_module(name.removesuffix(".__init__"))
print(len(names))
"""


def test_the_backend_imports_on_the_oldest_python(tmp_path: Path) -> None:
    """Every module of the app's backend, with the app environment's packages, on the oldest Python here."""
    version, python = oldest()
    packages = Path(sys.prefix) / "lib" / f"python{version[0]}.{version[1]}" / "site-packages"
    if version[:2] != sys.version_info[:2] or not packages.is_dir():
        pytest.skip(f"the app environment is Python {sys.version_info[0]}.{sys.version_info[1]}, the oldest "
                    f"here {'.'.join(map(str, version))}: its compiled packages do not load there")  # fmt: skip
    # not strict: the packages' own deprecation warnings (the suite's filterwarnings lists them) are not the point
    proc = run(python, IMPORT_ALL, str(packages), str(ROOT), strict=False, CHAINLIT_APP_ROOT=str(tmp_path),
               HOME=str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[-1]) > 100, proc.stdout


def test_no_sqlite_connection_is_left_open_by_a_with_block() -> None:
    """The newest Python in the range (3.13, Debian 13's) warns of a sqlite3 connection collected while open, and
    `with sqlite3.connect(...)` only commits: the tests after such a block failed there (tests/sqlite_file.py)."""
    found = []
    for path in sorted(
        [ROOT / "app.py", *(p for d in ("backend", "tests", "scripts") for p in (ROOT / d).rglob("*.py"))]
    ):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for item in node.items if isinstance(node, ast.With | ast.AsyncWith) else []:
                call = item.context_expr
                if isinstance(call, ast.Call) and ast.unparse(call.func) == "sqlite3.connect":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], f"use tests.sqlite_file.opened (or close the connection) instead: {found}"
