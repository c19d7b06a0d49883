"""The scripts are not collected by pytest: the tools under scripts/ (scripts/gpu/ for the lent GPU machines) and the
measurements kept beside their results (results/<name>/). Every name they import from the project exists (a refactor
that moves a helper breaks a measurement script only when someone next runs it, otherwise), and every tool under
scripts/ says what it does with --help."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = sorted((ROOT / "scripts").rglob("*.py"))
SCRIPTS = sorted([*TOOLS, *(ROOT / "results").rglob("*.py")])


def _load(path: Path) -> object:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_what_a_script_imports_from_the_project_exists(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(script.parent))  # as when it runs: its siblings import each other by name
    tree = ast.parse(script.read_text(), filename=str(script))
    missing = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        sibling = script.parent / f"{node.module}.py"  # another script, imported by its name (its folder on the path)
        if node.module.split(".")[0] in ("backend", "tests") or sibling.is_file():
            module = importlib.import_module(node.module) if not sibling.is_file() else _load(sibling)
            missing += [f"{node.module}.{a.name}" for a in node.names if not hasattr(module, a.name)]
    assert missing == []


def _runs_as_main(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)


def _parser_with_description(tree: ast.Module) -> bool:
    return any(
        isinstance(n, ast.Call)
        and ast.unparse(n.func).endswith("ArgumentParser")
        and any(k.arg == "description" for k in n.keywords)
        for n in ast.walk(tree)
    )


@pytest.mark.parametrize("tool", TOOLS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_tool_answers_help(tool: Path) -> None:
    """A tool runs under `if __name__ == "__main__"` with an argparse parser that has a description; a file without
    one is a module its siblings import."""
    tree = ast.parse(tool.read_text(), filename=str(tool))
    if _runs_as_main(tree):
        assert _parser_with_description(tree), f"{tool.name}: argparse with a description, for --help"
    else:
        siblings = [p.read_text() for p in tool.parent.glob("*.py") if p != tool]
        assert any(f"from {tool.stem} import" in s or f"import {tool.stem}" in s for s in siblings), tool.name


def test_the_scripts_are_found() -> None:
    names = {p.name for p in SCRIPTS}
    assert len(TOOLS) > 10 and {"gpu_tune.py", "bench_cpu_engines.py", "measure_comeback.py"} <= names
