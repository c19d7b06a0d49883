"""The app's own packages for the lent GPU machine's Python 3.12, as one folder to unpack beside the vLLM bundle.

usage: .venv/bin/python scripts/gpu/gpu_appsite.py [OUT_TAR]     (default .gpu/app/appsite.tar.xz)

The packages are those requirements.txt brings into this checkout's .venv, at the versions installed there (the
ones the app's tests ran with), followed through their dependencies as Python 3.12 on Linux would install them.
A pure-Python package is copied from .venv as installed; a compiled one is downloaded from the package index as
the cp312 manylinux wheel of the same version (run this here: the GPU machine has no network). Left out: the
plotting library (benchmark plots only) and what the vLLM bundle already has (.gpu/gpubundle.tar.xz: the app
finds those on the path after its own folder). Used by `bash scripts/gpu/gpu_run.sh chat`.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LEFT_OUT = {"matplotlib"}
TARGET_ENV = default_environment() | {"python_version": "3.12", "python_full_version": "3.12.3"}
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
for tag in ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64"):
    PLATFORM += ["--platform", tag]


def top_level() -> list[str]:
    names = []
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            names.append(canonicalize_name(Requirement(line).name))
    return [n for n in names if n not in LEFT_OUT]


def closure(names: list[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions `names` need on Python 3.12, by name."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        dist = metadata.distribution(name)
        found[name] = dist
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate(TARGET_ENV | {"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return found


def in_bundle() -> set[str]:
    bundle = ROOT / ".gpu" / "gpubundle.tar.xz"
    with tarfile.open(bundle) as tar:
        wheels = [Path(m.name).name for m in tar.getmembers() if "/wheels/" in m.name and m.name.endswith(".whl")]
    return {canonicalize_name(w.split("-")[0]) for w in wheels}


def compiled(dist: metadata.Distribution) -> bool:
    return any(str(f).endswith((".so", ".pyd")) for f in dist.files or [])


def main(out: Path) -> None:
    have = in_bundle()
    needed = {n: d for n, d in closure(top_level()).items() if n not in have}
    with tempfile.TemporaryDirectory() as tmp:
        site, wheels = Path(tmp) / "site", Path(tmp) / "wheels"
        site.mkdir()
        native = [f"{d.metadata['Name']}=={d.version}" for d in needed.values() if compiled(d)]
        if native:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), *PLATFORM, *native]
            subprocess.run(cmd, check=True)
            for whl in wheels.glob("*.whl"):
                zipfile.ZipFile(whl).extractall(site)
        for dist in needed.values():
            if compiled(dist):
                continue
            base = Path(str(dist.locate_file("")))
            for f in dist.files or []:
                if f.parts[0] == ".." or "__pycache__" in f.parts or f.suffix == ".pyc":
                    continue  # console scripts outside site-packages; byte code of this machine's Python
                src = base / f
                if src.is_file():
                    dst = site / f
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    dst.write_bytes(src.read_bytes())
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out, "w:xz", preset=6) as tar:
            tar.add(site, arcname=".")
    pure = len(needed) - len(native)
    print(f"{len(needed)} packages ({pure} copied from .venv, {len(native)} cp312 wheels): {out}")
    print("not carried, in the vLLM bundle:", " ".join(sorted(have & set(closure(top_level())))))
    print("compiled:", " ".join(re.sub(r"==.*", "", n) for n in native))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "out", type=Path, nargs="?", default=ROOT / ".gpu" / "app" / "appsite.tar.xz", help="the archive"
    )
    main(parser.parse_args().out)
