"""The house rules of backend/, checked on its source: arrows run one way, no cycles, nothing hidden in functions.

Layers, lowest first (a module imports its own package and lower layers only): catalogue (the words) →
errors/logs/files and child/ → config → models → engines → serving, prompts → chat → accounts, storage → workshop,
api, documents → ops, benchmarks → tuning → web, cli (and app.py on top). child/ holds the scripts the engine's own
interpreter runs: it imports nothing of backend outside child/. Engine names are compared only in
backend/engines/registry.py. The web framework is met in one room: only web/ and storage/ (Chainlit's data layer)
import Chainlit, and app.py, whose hooks forward to web/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from backend.config import ROOT, EngineName

BACKEND = ROOT / "backend"
RANKS = {
    "catalogue": -1,
    "errors": 0,
    "logs": 0,
    "files": 0,
    "child": 0,
    "config": 1,
    "models": 2,
    "engines": 3,
    "serving": 4,
    "prompts": 4,
    "chat": 5,
    "accounts": 6,
    "storage": 6,
    "workshop": 7,
    "api": 7,
    "documents": 7,
    "ops": 8,
    "benchmarks": 8,
    "tuning": 9,
    "web": 10,
    "cli": 10,
    "__main__": 11,
}
# Top-layer packages that may use each other's parts: the benchmarks read engine metrics with ops' parser.
# The API asks who is local the workshop's way, and answers from a user's documents (backend.documents).
SIDEWAYS = {("benchmarks", "ops"), ("api", "workshop"), ("api", "documents")}
ENGINE_NAMES = set(EngineName.__args__) - {"auto"}  # type: ignore[attr-defined]
REGISTRY = BACKEND / "engines" / "registry.py"
CHAINLIT_ROOMS = {"web", "storage", "app"}  # the packages that may import Chainlit


def modules() -> dict[str, Path]:
    found = {"app": ROOT / "app.py"}
    for path in BACKEND.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = modules()


def package(module: str) -> str:
    """backend.chat.service -> chat; backend.config -> config; app -> app."""
    parts = module.split(".")
    return parts[1] if parts[0] == "backend" and len(parts) > 1 else parts[0]


def backend_imports(path: Path) -> list[tuple[ast.AST, str, bool]]:
    """(node, imported backend module, inside a function) for every import of backend in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[ast.AST, str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend((child, a.name, inside) for a in child.names if a.name.startswith("backend"))
            elif isinstance(child, ast.ImportFrom) and child.module and child.module.startswith("backend"):
                for alias in child.names:
                    sub = f"{child.module}.{alias.name}"
                    found.append((child, sub if sub in MODULES else child.module, inside))
            visit(child, inside)

    visit(tree, False)
    return found


def chainlit_imports(tree: ast.AST) -> list[int]:
    """The lines that import Chainlit (anywhere in the file, inside functions too)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else []
        else:
            continue
        if any(name == "chainlit" or name.startswith("chainlit.") for name in names):
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("name", sorted(MODULES))
def test_only_web_and_storage_import_chainlit(name: str) -> None:
    if package(name) in CHAINLIT_ROOMS:
        return
    lines = chainlit_imports(ast.parse(MODULES[name].read_text(encoding="utf-8")))
    assert not lines, f"{name} imports Chainlit (lines {lines}): the web framework is met in backend/web/ only"


def test_app_forwards_to_web_only() -> None:
    """app.py registers Chainlit's hooks and forwards them to backend/web/: it imports nothing else of backend."""
    others = [target for _, target, _ in backend_imports(MODULES["app"]) if package(target) != "web"]
    assert not others, f"app.py imports {others}: its hooks' bodies belong in backend/web/"


def test_chainlit_is_met_in_web() -> None:
    """The rule above holds something: web/ is where the app meets Chainlit."""
    web = [n for n in MODULES if package(n) == "web"]
    assert any(chainlit_imports(ast.parse(MODULES[n].read_text(encoding="utf-8"))) for n in web)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_backend_import_inside_a_function(name: str) -> None:
    hidden = [f"line {node.lineno}: {target}" for node, target, inside in backend_imports(MODULES[name]) if inside]
    assert not hidden, f"{name} imports inside a function (it would hide a cycle): {hidden}"


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m != "app"))
def test_imports_run_down_the_layers(name: str) -> None:
    own = package(name)
    wrong = []
    for node, target, _ in backend_imports(MODULES[name]):
        other = package(target)
        if other == own or (own, other) in SIDEWAYS:
            continue
        if own == "child" or RANKS[other] >= RANKS[own]:
            wrong.append(f"line {node.lineno}: {target} ({other})")
    assert not wrong, f"{name} ({own}, layer {RANKS[own]}) imports upward or sideways: {wrong}"


def test_no_import_cycle() -> None:
    graph = {name: {t for _, t, _ in backend_imports(path) if t in MODULES} for name, path in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def cycle_from(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := cycle_from(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := cycle_from(start, [start])):
            pytest.fail("import cycle: " + " -> ".join(found))


def _engine_names_compared(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for side in [node.left, *node.comparators]:
            values = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
            if any(isinstance(v, ast.Constant) and v.value in ENGINE_NAMES for v in values):
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("name", sorted(MODULES))
def test_engine_names_are_compared_only_in_the_registry(name: str) -> None:
    path = MODULES[name]
    if path == REGISTRY:
        return
    lines = _engine_names_compared(ast.parse(path.read_text(encoding="utf-8")))
    assert not lines, f"{name} compares engine names (lines {lines}); ask the engine (backend.engines) instead"


def test_the_checks_see_what_they_look_for() -> None:
    """The scans above find a hidden import, an upward arrow, an engine-name comparison and a Chainlit import when
    there is one."""
    sample = (
        "from backend.chat import service\ndef f():\n    from backend.web import routes\n    return x == 'vllm-cpu'\n"
        "def g():\n    import chainlit.server as s\n    from chainlit import config\n"
    )
    tree = ast.parse(sample)
    assert _engine_names_compared(tree) == [4]
    assert chainlit_imports(tree) == [6, 7]
    path = ROOT / ".pytest_cache" / "layout_sample.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(sample, encoding="utf-8")
    assert [(t, inside) for _, t, inside in backend_imports(path)] == [
        ("backend.chat.service", False),
        ("backend.web.routes", True),
    ]
    assert RANKS[package("backend.chat.service")] > RANKS[package("backend.engines.base")]
