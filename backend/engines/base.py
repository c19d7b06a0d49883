"""What every engine is to the rest of the app: one small interface, the launch it builds, the address it serves.

An engine module (vllm.py, llamacpp.py, trtllm.py, external.py) knows its own command line, install check,
model format and the ways it can run (its candidates); backend.engines.registry maps `EngineName` to it.
Nothing outside this package compares engine names: callers ask the engine's attributes instead.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from backend.config import ROOT, AppConfig, EngineFlags, EngineName
from backend.engines.options import FlagParser
from backend.models.info import ModelInfo
from backend.models.resolve import ResolvedModel, resolve_model

ENGINE_VENV_PYTHON = ROOT / ".venv-engine" / "bin" / "python"

Note = Callable[[str | None], None]  # shows a line about the model (converting, demo) while the engine starts


class Api(enum.StrEnum):
    """The name of a server's dialect beside the OpenAI API (backend.engines.dialect; the registry maps it)."""

    VLLM = "vllm"  # vLLM and servers like it: /tokenize takes messages, prompt_logprobs (engines/vllm.py)
    LLAMACPP = "llama.cpp"  # llama-server: /apply-template then /tokenize, /completion's n_probs (engines/llamacpp.py)


class Severity(enum.StrEnum):
    """How bad a failure found in an engine's log is (backend.ops.doctor)."""

    ERROR = "error"  # the engine cannot serve: exit code 1
    WARNING = "warning"  # it serves, under strain


@dataclass(frozen=True)
class Signature:
    """One known failure in an engine's log: the patterns that reveal it and what to do (the engine declares it)."""

    name: str
    title: str
    severity: Severity
    patterns: tuple[re.Pattern[str], ...]
    cause: str  # may name {detail}: the text the pattern's group `detail` found
    fix: str
    fallback: bool = False  # reported only when no specific error was found


def patterns(*sources: str) -> tuple[re.Pattern[str], ...]:
    """A signature's patterns, compiled."""
    return tuple(re.compile(p) for p in sources)


@dataclass
class Endpoint:
    """Where the engine's OpenAI-compatible API is and how to call it (`api` changes on a fallback)."""

    base_url: str  # the server's root, without /v1
    api_key: str
    model: str
    api: Api = Api.VLLM
    external: bool = False  # a server the app does not run (engine.name external): nothing restarts it

    @property
    def headers(self) -> dict[str, str]:
        return bearer(self.api_key)


def bearer(api_key: str | None) -> dict[str, str]:
    """The headers that carry an OpenAI-compatible server's key (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@dataclass(frozen=True)
class Candidate:
    """One way to run an engine: which engine, and its own alternative (CPU kernels, or dtype)."""

    engine: EngineName
    variant: str
    # An engine build may refuse to start this one at all (FP8 on a card or a vLLM install without its kernels): an
    # exit during start-up then gives way to the next candidate, as wrong answers do, instead of stopping the start.
    may_refuse: bool = False

    @property
    def label(self) -> str:
        return f"{self.engine} {self.variant}"


@dataclass(frozen=True)
class Weights:
    """What the canary compares: the served weights' reference source and the format the engine computes in."""

    model: str  # a folder (or the folder of a GGUF file) transformers loads in float32
    gguf_file: str | None  # the GGUF file inside `model` to load, when the weights are a GGUF
    number_format: str  # a key of serving.answers.tolerance.TOLERANCES: float32, bfloat16, q8_0, q4_k_m, q4_1...


@dataclass(frozen=True)
class Target:
    """What an engine is started for: the model files, the port, the API key, the engine's interpreter."""

    model: str
    port: int
    api_key: str
    python: str


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one engine process and to talk to it."""

    engine: EngineName
    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    served_name: str
    api_key: str
    flags: EngineFlags = field(default_factory=EngineFlags)
    args: list[str] = field(default_factory=list)  # the flags part of argv, as the engine's parser reads it
    api: Api = Api.VLLM
    url: str | None = None  # set for an external server; else derived from host and port
    health_path: str = "/health"  # a GET that answers 200 while the server is alive
    cwd: str | None = None  # the child's working directory (None: the app's)
    variant: str | None = None  # which of the engine's own alternatives runs (llama.cpp: the CPU kernels)
    weights: Weights | None = None  # what the canary checks this engine against (None: no check)
    build: str = ""  # identifies the engine's installed build, for the canary's verdict cache
    demo: bool = False  # the offline demo model answers (the chat uses the demo's own defaults)
    # Replies the engine runs at once (llama.cpp's slots, vLLM's max_num_seqs): the app's admission lets this many
    # through and queues the rest (None: the server queues itself, e.g. an external one).
    capacity: int | None = None
    # What the engine gets when the app dies without stopping it (SIGKILL, the OOM killer: backend/child/
    # die_with_parent.py): SIGTERM lets vLLM take its own children down; an engine without such children may take
    # SIGKILL, which it cannot hang in.
    death_signal: int = signal.SIGTERM

    def with_check(self, weights: Weights, build: str, demo: bool = False) -> LaunchSpec:
        """This spec with what the canary checks it against (and whether it serves the demo model)."""
        return dataclasses.replace(self, weights=weights, build=build, demo=demo)

    @property
    def spawns(self) -> bool:
        """Whether the app runs this server as its child (False: an external server)."""
        return self.url is None

    @property
    def base_url(self) -> str:
        """The server's root URL (without /v1)."""
        return (self.url or f"http://{self.host}:{self.port}").rstrip("/")


def engine_python(cfg: AppConfig) -> str:
    """Return the interpreter that runs the engine (configured, the engine venv, or our own)."""
    if cfg.engine.python:
        return str(Path(cfg.engine.python).expanduser())
    if ENGINE_VENV_PYTHON.exists():
        return str(ENGINE_VENV_PYTHON)
    return sys.executable


def installed_dists(python: str, prefix: str) -> str:
    """What identifies the engine build in `python`'s environment: its `prefix`* packages' dist-info folders, and a
    digest of every package installed there (torch's version, say, changes it) under its Python version. Where the
    environment is does not enter: a new checkout that installs the same packages on the same machine keeps the
    answer check's verdicts and the tune's result."""
    venv = Path(python).parent.parent
    every = sorted(p.relative_to(venv).as_posix() for p in venv.glob("lib/python*/site-packages/*.dist-info"))
    if not every:  # not a virtual environment's layout (a system Python): the interpreter itself, as before
        return python
    found = sorted(Path(p).name for p in every if Path(p).name.startswith(prefix))
    digest = hashlib.sha256("\n".join(every).encode()).hexdigest()[:12]
    return f"{' '.join(found)} (environment {digest})"


class Engine:
    """One inference server the app can use. Subclasses set the class attributes and build the launch."""

    name: ClassVar[EngineName]
    api: ClassVar[Api] = Api.VLLM
    on_gpu: ClassVar[bool] = False  # needs an NVIDIA GPU: GPU profiles and checks apply
    spawns: ClassVar[bool] = True  # the app starts it as a child process (False: an external server)
    flag_parser: ClassVar[FlagParser | None] = None  # its own parser, which checks the flags (preflight)
    uses_profiles: ClassVar[bool] = True  # its flags come from the hardware profiles (llama.cpp's do not)
    flag_for: ClassVar[Mapping[str, str]] = {}  # EngineFlags field -> the flag it becomes (for messages naming keys)
    # CPU flags of which one must be present for an FP8 KV cache (None: no such limit)
    fp8_kv_cpu_flags: ClassVar[frozenset[str] | None] = None
    # The failures its log reveals, each with its cause and fix (the doctor scans the engine log for them)
    log_signatures: ClassVar[tuple[Signature, ...]] = ()

    def installed(self, cfg: AppConfig, python: str) -> bool:
        """Whether it can start here (for engine.name auto, which skips engines that are not installed)."""
        return True

    def check_installed(self, cfg: AppConfig, python: str) -> None:
        """Raise EngineNotInstalledError, saying how to install it, when it cannot start here."""

    def health_path(self, cfg: AppConfig) -> str:
        """The GET that answers 200 while its server can serve (the supervisor's checks, the doctor's)."""
        return LaunchSpec.health_path

    def flags(self, cfg: AppConfig, profile_flags: EngineFlags) -> EngineFlags:
        """The flags the rest of the app reads (context window, dtype) from the profile's."""
        return profile_flags

    def section_flags(self, cfg: AppConfig) -> dict[str, str]:
        """Flags its own configuration section puts on the command line -> that key (for messages naming keys)."""
        return {}

    def candidates(self, cfg: AppConfig, flags: EngineFlags) -> list[Candidate]:
        """The ways to run it, best first; the canary starts the next when one crashes or answers wrongly."""
        return [Candidate(self.name, flags.dtype or "auto")]

    def resolve(self, cfg: AppConfig, python: str, note: Note) -> ResolvedModel:
        """The model files it serves (converted if need be)."""
        return resolve_model(cfg, python)

    def launch(self, cfg: AppConfig, target: Target, flags: EngineFlags, variant: str | None = None) -> LaunchSpec:
        """The argument list and environment that start it serving `target.model` on `target.port`."""
        raise NotImplementedError

    def check_model(
        self, cfg: AppConfig, model: ModelInfo | None, supported: dict[str, list[str]], version: str
    ) -> None:
        """Raise ConfigError when the installed engine (its `supported` model registries) cannot run `model`."""

    def number_format(self, cfg: AppConfig, variant: str, resolved: ResolvedModel) -> str:
        """The number format a candidate computes in: a key of backend.serving.answers.tolerance.TOLERANCES."""
        return "float32" if variant == "float32" else "bfloat16"

    def tune_formats(self, cfg: AppConfig, model: ResolvedModel, python: str) -> list[str]:
        """The number formats the tune measures this engine in for `model`, one candidate each."""
        return [self.number_format(cfg, "auto", model)]

    def tune_builds(self, cfg: AppConfig) -> list[str]:
        """The engine's own builds the tune measures against each other, best first (llama.cpp: its CPU kernel
        variants); [""]: none to compare, the engine runs as configured (its canary's order)."""
        return [""]

    def in_build(self, cfg: AppConfig, build: str) -> AppConfig:
        """`cfg` set to run this engine's `build` (one of tune_builds); "" changes nothing."""
        return cfg

    def format_on_auto(self, cfg: AppConfig) -> bool:
        """Whether the configuration leaves this engine's format to the tune."""
        return False

    def in_format(self, cfg: AppConfig, fmt: str) -> AppConfig:
        """`cfg` set to run this engine in `fmt` (one of tune_formats); a format that is no setting changes nothing."""
        return cfg

    def with_places(self, cfg: AppConfig, places: int) -> AppConfig:
        """`cfg` with this engine running `places` replies at once (the tune's measured places); an engine without
        such a setting is left as it is."""
        return cfg

    def weights(self, cfg: AppConfig, variant: str, resolved: ResolvedModel) -> Weights:
        """What the canary compares the candidate with: the weights it serves, loaded in float32 by transformers."""
        return Weights(resolved.source or resolved.model, None, self.number_format(cfg, variant, resolved))

    def build_id(self, cfg: AppConfig, python: str) -> str:
        """An identifier of the installed engine build (a new build invalidates cached verdicts)."""
        return installed_dists(python, self.flag_parser.name if self.flag_parser else self.name)
