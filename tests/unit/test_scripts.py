"""The scripts under scripts/ are not collected by pytest: every name they import from the project exists (a
refactor that moves a helper breaks a measurement script only when someone next runs it, otherwise)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_what_a_script_imports_from_the_project_exists(script: Path) -> None:
    tree = ast.parse(script.read_text(), filename=str(script))
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("backend", "tests"):
            module = importlib.import_module(node.module)
            missing += [f"{node.module}.{a.name}" for a in node.names if not hasattr(module, a.name)]
    assert missing == []


def test_the_scripts_are_found() -> None:
    assert len(SCRIPTS) > 10 and any(p.name == "measure_comeback.py" for p in SCRIPTS)
