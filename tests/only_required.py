"""Run a module with only what a requirements file brings importable (run by the engine's interpreter).

usage: python tests/only_required.py REQUIREMENTS -m MODULE [ARGS...]

The installed distributions the file names, with everything they require (markers evaluated, extras followed),
may be imported; a module of any other installed distribution raises ModuleNotFoundError, as it would in an
environment installed from that file alone. The standard library and this repository stay importable.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata as md
import runpy
import sys
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def _requirements(path: Path) -> list[Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith("-")]


def closure(roots: list[Requirement]) -> set[str]:
    """Canonical names of the installed distributions the roots require, transitively."""
    seen: set[str] = set()
    walked: set[tuple[str, str]] = set()  # (distribution, extra) whose requirements are followed already
    todo = list(roots)
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # not installed here: nothing of it can be imported either way
        extras = {"", *req.extras}
        if all((name, e) in walked for e in extras):
            continue
        walked.update((name, e) for e in extras)
        seen.add(name)
        for line in dist.requires or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                todo.append(sub)
    return seen


class OnlyRequired(importlib.abc.MetaPathFinder):
    """One of the interpreter's finders that finds nothing of the blocked top-level names (so that
    `importlib.util.find_spec` says "absent", as libraries probing for optional packages expect)."""

    def __init__(self, finder: Any, blocked: set[str]) -> None:
        self.finder, self.blocked = finder, blocked

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name.split(".")[0] in self.blocked:
            return None
        return self.finder.find_spec(name, path, target)

    def find_distributions(self, *args: Any, **kwargs: Any) -> Any:  # importlib.metadata asks the finders too
        return getattr(self.finder, "find_distributions", lambda *a, **k: ())(*args, **kwargs)

    def invalidate_caches(self) -> None:
        getattr(self.finder, "invalidate_caches", lambda: None)()


def main() -> None:
    reqs, flag, module, *args = sys.argv[1:]
    assert flag == "-m", __doc__
    allowed = closure(_requirements(Path(reqs)))
    blocked = {
        top
        for top, dists in md.packages_distributions().items()
        if not any(canonicalize_name(d) in allowed for d in dists)
    }
    sys.meta_path[:] = [OnlyRequired(f, blocked) for f in sys.meta_path]
    sys.argv = [module, *args]
    sys.path[0] = str(Path.cwd())  # as `python -m` does: the module is found from the working directory
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
