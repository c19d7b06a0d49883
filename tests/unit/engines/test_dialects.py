"""A new engine with a dialect of its own touches only backend/engines/ (and the config's list of names).

Proved from the registry and the source: every dialect name has a dialect that does all a dialect does, every
engine speaks a registered one, and outside backend/engines/ no module's code names a dialect, imports a dialect's
or a flag parser's class, or says a word of a server's own: its endpoints and request fields, its health path, its
Prometheus metrics, the patterns of its log, its name. The forbidden words are the engines' own declarations
(Dialect.words, Dialect.metric_prefix, Engine.log_signatures, Engine.name), so the scan grows with them: callers
reach all of it through backend.engines.registry, and an engine added in engines/ is found everywhere it is needed.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path

import pytest

from backend.config import ROOT
from backend.engines.base import Api, Endpoint, LaunchSpec
from backend.engines.dialect import Dialect, LogprobSource, TokenCounter
from backend.engines.registry import DIALECTS, ENGINES, GENERIC_API, dialect

BACKEND = ROOT / "backend"
ENGINES_DIR = BACKEND / "engines"
# What only an engine's module may say: its server's own endpoints and request fields beside the OpenAI API, and
# the health path it answers on.
DIALECT_WORDS = sorted({w for d in DIALECTS.values() for w in d.words} | {LaunchSpec.health_path})
METRIC_PREFIXES = sorted({d.metric_prefix for d in DIALECTS.values() if d.metric_prefix})
LOG_PATTERNS = sorted({p.pattern for e in ENGINES.values() for s in e.log_signatures for p in s.patterns})
ENGINE_NAMES = sorted(e.name for e in ENGINES.values() if e.spawns)  # "external" also means "not ours" elsewhere
# Modules outside engines/ that may name an engine or its health path, and why.
NAMES_ALLOWED = {
    "backend/config.py": "the config's list of engine names (EngineName) and server.health_path's default",
}
# Folders outside engines/ whose modules may name an engine: they run in one engine's own interpreter, standard
# library only (backend.engines cannot be imported there), each written for that engine.
NAMES_ALLOWED_UNDER = {
    "backend/child/": "scripts the engine's own interpreter runs (engine_probe.py's argument is FlagParser.name)",
}


def _word(word: str) -> re.Pattern[str]:
    """`word` standing alone in a string: "/tokenize" in base + "/tokenize", not "/health" in "/healthz"."""
    before = r"(?<![\w-])" if re.match(r"\w", word) else ""
    return re.compile(before + re.escape(word) + r"(?![\w-])")


WORD_PATTERNS = [(w, _word(w)) for w in DIALECT_WORDS]
PREFIX_PATTERNS = [(p, re.compile(r"(?<![\w-])" + re.escape(p))) for p in METRIC_PREFIXES]


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


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes in `tree` (prose may name an engine's endpoint; code may not)."""
    kinds = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _names(tree: ast.AST, names_allowed: bool = False) -> list[tuple[int, str]]:
    """(line, what) for each dialect name (Api.X), engine-module import and engine word in a module's code."""
    found: list[tuple[int, str]] = []
    engine_modules = {f"backend.engines.{p.stem}" for p in ENGINES_DIR.glob("*.py")} - {
        "backend.engines.__init__",
        "backend.engines.base",
        "backend.engines.dialect",
        "backend.engines.registry",
        "backend.engines.options",
    }
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Api":
            found.append((node.lineno, f"Api.{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and node.module in engine_modules:
            found.append((node.lineno, f"import of {node.module}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
            words = [w for w, pattern in WORD_PATTERNS if pattern.search(text)]
            if names_allowed:
                words = [w for w in words if w != LaunchSpec.health_path]
            found += [(node.lineno, f"word {w!r}") for w in words]
            found += [(node.lineno, f"metric {p!r}") for p, pattern in PREFIX_PATTERNS if pattern.search(text)]
            found += [(node.lineno, "log pattern") for p in LOG_PATTERNS if p == text]
            if not names_allowed and text in ENGINE_NAMES:
                found.append((node.lineno, f"engine name {text!r}"))
    return sorted(found)


def _names_allowed(relative: str) -> bool:
    return relative in NAMES_ALLOWED or any(relative.startswith(folder) for folder in NAMES_ALLOWED_UNDER)


@pytest.mark.parametrize("path", outside_engines(), ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_outside_engines_knows_a_dialect(path: Path) -> None:
    relative = str(path.relative_to(ROOT))
    found = _names(ast.parse(path.read_text(encoding="utf-8")), _names_allowed(relative))
    assert not found, f"{relative} knows an engine's dialect: {found}; ask the engine (backend.engines.registry)"


def test_the_forbidden_words_come_from_the_engines() -> None:
    """The derived lists hold what the engines say today (an empty declaration would let the scan pass by itself)."""
    words = {"/tokenize", "/apply-template", "/props", "/completion", "prompt_logprobs", "n_probs", "/health"}
    assert words <= set(DIALECT_WORDS)
    assert {"vllm:", "llamacpp:"} <= set(METRIC_PREFIXES)
    assert len(LOG_PATTERNS) >= 9
    assert {"vllm", "vllm-cpu", "llama.cpp", "trtllm"} <= set(ENGINE_NAMES)


@pytest.mark.parametrize("api", list(Api))
def test_a_dialect_declares_only_what_its_module_says(api: Api) -> None:
    """Each declared word and metric is said in the dialect's own module: the declarations cannot go stale."""
    found = dialect(api)
    source = inspect.getsource(sys.modules[type(found).__module__])
    for word in found.words:
        assert f'"{word}"' in source, f"{api} declares {word!r}, which its module never says"
    if found.load_metrics is not None:
        assert found.metric_prefix is not None
        assert all(name.startswith(found.metric_prefix) for name in vars(found.load_metrics).values())


def test_the_scan_sees_what_it_looks_for() -> None:
    sample = (
        "from backend.engines.llamacpp import PROBE\n"
        "x = Api.LLAMACPP\n"
        "url = base + '/apply-template'\n"
        "m = totals['vllm:num_requests_running']\n"
        "ok = '/healthz'\n"
        "h = f'{root}/health'\n"
        "n = 'trtllm'\n"
        f"p = re.compile({LOG_PATTERNS[0]!r})\n"
        "def f():\n"
        "    'Docstrings may name /tokenize and vllm:num_requests_running.'\n"
    )
    assert [what for _, what in _names(ast.parse(sample))] == [
        "import of backend.engines.llamacpp",
        "Api.LLAMACPP",
        "word '/apply-template'",
        "metric 'vllm:'",
        "word '/health'",
        "engine name 'trtllm'",
        "log pattern",
    ]
    assert [what for _, what in _names(ast.parse(sample), names_allowed=True)][3:] == ["metric 'vllm:'", "log pattern"]
