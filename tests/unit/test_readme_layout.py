"""The README's layout against the tree: every package and module of backend/ is named there, nothing named there is
gone, and the packages come in the order the imports run (tests/unit/test_layout.py's layers, highest first), so the
map a newcomer reads cannot go stale again."""

from __future__ import annotations

import re
from pathlib import Path

from backend.config import ROOT
from tests.unit.test_layout import RANKS

README = ROOT / "README.md"
BACKEND = ROOT / "backend"
MODULE = re.compile(r"\b([a-z_][a-z0-9_]*\.py)\b")


def layout() -> dict[str, str]:
    """The README's layout block: each entry's path (a line's first word, and any other path after a wide gap on the
    same line) with the text that describes it, continuation lines included."""
    text = README.read_text(encoding="utf-8")
    start = text.index("## Layout")
    block = text[text.index("```\n", start) + 4 : text.index("```", text.index("```\n", start) + 4)]
    entries: dict[str, str] = {}
    current = ""
    for line in block.splitlines():
        if line and not line[0].isspace():
            first, _, rest = line.partition(" ")
            current = first
            entries[current] = rest
            for other in re.findall(r"\s{2,}((?:backend/)[a-z_./]+)\s", line):  # "backend/logs.py   the app's..."
                entries[other] = ""
        else:
            entries[current] += " " + line.strip()
    return entries


ENTRIES = layout()


def packages() -> list[Path]:
    return sorted(p for p in BACKEND.iterdir() if p.is_dir() and (p / "__init__.py").exists())


def test_every_package_of_backend_has_an_entry_and_every_entry_exists() -> None:
    named = {path for path in ENTRIES if path.startswith("backend/")}
    for package in packages():
        assert f"backend/{package.name}/" in named, f"backend/{package.name}/ is missing from the README's layout"
    for path in ENTRIES:
        if "<" not in path:
            assert (ROOT / path).exists(), f"the README's layout names {path}, which is gone"
    top = {p.name for p in BACKEND.glob("*.py") if p.name != "__init__.py"}
    assert {f"backend/{name}" for name in top} <= named, top - {p.removeprefix("backend/") for p in named}


def test_every_module_of_a_package_is_named_in_its_entry_and_every_name_exists() -> None:
    for package in packages():
        text = ENTRIES[f"backend/{package.name}/"]
        modules = {p.relative_to(package).name for p in package.rglob("*.py") if p.name != "__init__.py"}
        named = set(MODULE.findall(text))
        assert modules - named == set(), f"backend/{package.name}/: not in the README's layout: {modules - named}"
        assert named - modules == set(), f"backend/{package.name}/: named in the README, gone: {named - modules}"


def test_the_packages_come_in_the_order_the_imports_run() -> None:
    order = [path.split("/")[1].removesuffix(".py") for path in ENTRIES if path.startswith("backend/")]
    ranks = [RANKS[name] for name in order if name in RANKS]
    assert ranks == sorted(ranks, reverse=True), list(zip(order, ranks, strict=False))
