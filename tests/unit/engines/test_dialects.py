"""A new engine with a dialect of its own touches only backend/engines/ (and the config's list of names).

Proved from the registry and the source: every dialect name has a dialect that does all a dialect does, every
engine speaks a registered one, and outside backend/engines/ no module names a dialect, imports a dialect's or a
flag parser's class, or says a word of a server's own API (its endpoints and fields): callers reach all of it
through backend.engines.registry. A dialect added in engines/ is therefore found everywhere it is needed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from backend.config import ROOT
from backend.engines.base import Api, Endpoint
from backend.engines.dialect import Dialect, LogprobSource, TokenCounter
from backend.engines.registry import DIALECTS, ENGINES, GENERIC_API, dialect

BACKEND = ROOT / "backend"
ENGINES_DIR = BACKEND / "engines"
# What only a dialect may say: the servers' own endpoints and request fields beside the OpenAI API.
DIALECT_WORDS = ("/tokenize", "/apply-template", "/props", "/completion", "prompt_logprobs", "n_probs")
# Modules outside engines/ that may import an engine's own module, and why.
ENGINE_COMMANDS = {
    "backend/cli.py": "the engine-specific commands (build-trt-engine, quantize-gguf) of one CLI",
}


def outside_engines() -> list[Path]:
    return sorted([ROOT / "app.py", *(p for p in BACKEND.rglob("*.py") if ENGINES_DIR not in p.parents)])


def test_every_dialect_name_has_a_dialect_and_every_engine_speaks_one() -> None:
    assert set(DIALECTS) == set(Api)
    assert all(d.api is api for api, d in DIALECTS.items())
    assert GENERIC_API in DIALECTS
    for engine in ENGINES.values():
        assert engine.api in DIALECTS, f"{engine.name} speaks {engine.api}, which no dialect implements"


@pytest.mark.parametrize("api", list(Api))
def test_each_dialect_does_all_a_dialect_does(api: Api) -> None:
    found = dialect(api)
    assert isinstance(found, Dialect)
    counter = found.counter(object(), Endpoint("http://e", "k", "m", api))  # type: ignore[arg-type]
    assert isinstance(counter, TokenCounter) and type(counter).request is not TokenCounter.request
    source = found.logprob_source(object(), "m")  # type: ignore[arg-type]
    assert isinstance(source, LogprobSource) and source.model == "m"
    assert type(source).render is not LogprobSource.render and type(source).positions is not LogprobSource.positions


def test_only_the_generic_dialect_recognizes_nothing() -> None:
    """The benchmark asks every other dialect whether an outside server speaks it; only the generic one may not say."""
    lazy = [api for api, d in DIALECTS.items() if type(d).recognizes is Dialect.recognizes]
    assert lazy == [GENERIC_API]


def _names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each dialect name (Api.X), engine-module import and dialect word in a module."""
    found: list[tuple[int, str]] = []
    engine_modules = {f"backend.engines.{p.stem}" for p in ENGINES_DIR.glob("*.py")} - {
        "backend.engines.__init__",
        "backend.engines.base",
        "backend.engines.dialect",
        "backend.engines.registry",
        "backend.engines.options",
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Api":
            found.append((node.lineno, f"Api.{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and node.module in engine_modules:
            found.append((node.lineno, f"import of {node.module}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(node.lineno, repr(w)) for w in DIALECT_WORDS if node.value == w or node.value.endswith(w)]
    return found


@pytest.mark.parametrize("path", outside_engines(), ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_outside_engines_knows_a_dialect(path: Path) -> None:
    found = _names(ast.parse(path.read_text(encoding="utf-8")))
    allowed = str(path.relative_to(ROOT)) in ENGINE_COMMANDS
    found = [(line, what) for line, what in found if not (allowed and what.startswith("import of"))]
    assert not found, f"{path.relative_to(ROOT)} knows an engine's dialect: {found}; ask backend.engines.registry"


def test_the_scan_sees_what_it_looks_for() -> None:
    sample = "from backend.engines.llamacpp import PROBE\nx = Api.LLAMACPP\nurl = base + '/apply-template'\n"
    assert [what for _, what in _names(ast.parse(sample))] == [
        "import of backend.engines.llamacpp",
        "Api.LLAMACPP",
        "'/apply-template'",
    ]
