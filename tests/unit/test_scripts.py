"""The scripts under scripts/ are not collected by pytest: every name they import from the project exists (a
refactor that moves a helper breaks a measurement script only when someone next runs it, otherwise)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.py"))


def _load(path: Path) -> object:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_what_a_script_imports_from_the_project_exists(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(script.parent))  # as when it runs: its siblings import each other by name
    tree = ast.parse(script.read_text(), filename=str(script))
    missing = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        sibling = script.parent / f"{node.module}.py"  # another script, imported by its name (scripts/ on the path)
        if node.module.split(".")[0] in ("backend", "tests") or sibling.is_file():
            module = importlib.import_module(node.module) if not sibling.is_file() else _load(sibling)
            missing += [f"{node.module}.{a.name}" for a in node.names if not hasattr(module, a.name)]
    assert missing == []


def test_the_scripts_are_found() -> None:
    assert len(SCRIPTS) > 10 and any(p.name == "measure_comeback.py" for p in SCRIPTS)
