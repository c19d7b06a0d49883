"""Known failure signatures in the engine's log, each with its cause and its fix.

The patterns come from vLLM 0.32 itself: provoked with the real engine (unknown flag, missing model,
port in use, KV cache too small for max_model_len) or read from its source (out of memory, preemption
in the periodic stats line, time-outs, a dead engine core). tests/unit/data/engine_logs holds real samples.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

START_MARK = re.compile(r"^===== .* starting: ", re.MULTILINE)  # written by Supervisor before each start


class Severity(StrEnum):
    ERROR = "error"  # the engine cannot serve: exit code 1
    WARNING = "warning"  # it serves, under strain


@dataclass(frozen=True)
class Signature:
    """One known failure: the log patterns that reveal it and what to do."""

    name: str
    title: str
    severity: Severity
    patterns: tuple[re.Pattern[str], ...]
    cause: str
    fix: str
    fallback: bool = False  # reported only when no specific error was found


def _p(*patterns: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "unknown_flag",
        "Unknown engine flag",
        Severity.ERROR,
        _p(r"error: unrecognized arguments: (?P<detail>.+)", r"error: argument (?P<detail>--[\w-]+.*: invalid .+)"),
        "The engine was started with a flag (or value) this vLLM version does not accept: {detail}.",
        "Remove or correct it in engine.flags.extra_args (config/backend.yaml or ERNIE_ENGINE__FLAGS__EXTRA_ARGS); "
        "`.venv-engine/bin/python -m vllm.entrypoints.openai.api_server --help` lists the valid flags.",
    ),
    Signature(
        "port_in_use",
        "Port already in use",
        Severity.ERROR,
        _p(r"\[Errno 98\] (?P<detail>[Aa]ddress already in use)"),
        "Another program already listens on the engine's port.",
        "Stop that program (`ss -ltnp` shows it), or set server.port to another port "
        "(ERNIE_SERVER__PORT; 0 picks a free one).",
    ),
    Signature(
        "missing_model",
        "Model not found",
        Severity.ERROR,
        _p(
            r"Invalid repository ID or local directory specified: '(?P<detail>[^']+)'",
            r"HFValidationError: Repo id must be in the form .*: '(?P<detail>[^']+)'",
            r"(?P<detail>LocalEntryNotFoundError): Cannot find an appropriate cached snapshot folder",
            r"(?P<detail>RepositoryNotFoundError|GatedRepoError)",
            r"OSError: (?P<detail>.*does not appear to have a file named.*)",
        ),
        "The engine cannot find the model ({detail}): there is no folder with a config.json at that path "
        "and no copy in the local hub cache, and the hub cannot be reached.",
        "Set model.id (ERNIE_MODEL__ID) to a folder that holds config.json, the weights and the tokenizer; "
        "`python -m backend prepare-model` shows what the app would serve.",
    ),
    Signature(
        "kv_cache_insufficient",
        "KV cache too small",
        Severity.ERROR,
        _p(
            r"\((?P<detail>[\d.]+ GiB KV cache is needed, which is larger than the available KV cache memory "
            r"\([\d.]+ GiB\)\.(?: Based on the available memory, the estimated maximum model length is \d+\.)?)",
            r"(?P<detail>No available memory for the cache blocks)",
            r"(?P<detail>Available memory on node \d+ .* is less than requested memory for kv .*?\))",
        ),
        "The KV cache cannot hold even one request of max_model_len tokens: {detail}",
        "Lower engine.flags.max_model_len (below the estimate vLLM prints), or raise "
        "engine.flags.cpu_kvcache_space_gib (VLLM_CPU_KVCACHE_SPACE) if the machine has the memory.",
    ),
    Signature(
        "out_of_memory",
        "Out of memory",
        Severity.ERROR,
        _p(
            r"(?P<detail>DefaultCPUAllocator: can't allocate memory.*)",
            r"(?P<detail>(?:torch\.)?OutOfMemoryError.*|CUDA out of memory.*)",
            r"(?:^|\s)(?P<detail>MemoryError\b.*)$",
            r"(?P<detail>\[Errno 12\] Cannot allocate memory)",
            r"(?P<detail>died (?:with exit code -9|unexpectedly \(exit code: -9\)))",
        ),
        "The engine ran out of memory ({detail}); a process killed with signal 9 is usually the kernel's OOM killer.",
        "Lower engine.flags.cpu_kvcache_space_gib, max_num_seqs or max_model_len, stop other memory-hungry "
        "programs, and check `dmesg | grep -i oom`.",
    ),
    Signature(
        "request_timeout",
        "Time-out",
        Severity.ERROR,
        _p(
            r"(?P<detail>Timed out waiting for (?:new )?engine core processes to start)",
            r"(?P<detail>RPC call to \w+ timed out)",
            r"(?P<detail>TimeoutError: .+)",
        ),
        "Part of the engine did not answer in time: {detail}. The machine is overloaded, or starting is slow.",
        "Keep other work off the machine; raise VLLM_ENGINE_READY_TIMEOUT_S for slow starts, and "
        "timeouts.read_s / timeouts.startup_s in config/backend.yaml for slow replies.",
    ),
    Signature(
        "preemption",
        "Requests preempted",
        Severity.WARNING,
        _p(r"Preemptions: (?P<detail>[1-9]\d*)"),
        "The KV cache filled up under load and the engine preempted running requests ({detail} in one "
        "stats interval); they are recomputed later, so replies slow down.",
        "Raise engine.flags.cpu_kvcache_space_gib, or lower engine.flags.max_num_seqs so fewer requests run at once.",
    ),
    Signature(
        "kv_cache_full",
        "KV cache nearly full",
        Severity.WARNING,
        _p(r"KV cache usage: (?P<detail>(?:9\d|100)\.\d)%"),
        "The KV cache was {detail} % full: new requests wait and running ones may be preempted.",
        "Raise engine.flags.cpu_kvcache_space_gib, or lower max_num_seqs / max_model_len.",
    ),
    Signature(
        "engine_crashed",
        "Engine crashed",
        Severity.ERROR,
        _p(
            r"(?P<detail>Engine core initialization failed)",
            r"(?P<detail>EngineCore encountered (?:a fatal error|an issue))",
            r"(?P<detail>Engine core process \S+ died unexpectedly)",
        ),
        "The engine core stopped: {detail}.",
        "Read the traceback just above this line in the log for the root cause.",
        fallback=True,
    ),
)


@dataclass(frozen=True)
class Finding:
    """A signature found in a log: how often, and the first line that showed it."""

    signature: Signature
    count: int
    line: str
    detail: str

    @property
    def cause(self) -> str:
        return self.signature.cause.format(detail=self.detail)


def latest_start(text: str) -> str:
    """The part of a supervisor log written by the latest engine start (all of it when there is no mark)."""
    marks = list(START_MARK.finditer(text))
    return text[marks[-1].start() :] if marks else text


def scan(text: str) -> list[Finding]:
    """Every known signature in `text`, errors first; the fallback only when no specific error was found."""
    found: list[Finding] = []
    for sig in SIGNATURES:
        count, first, detail = 0, "", ""
        for line in text.splitlines():
            for pattern in sig.patterns:
                match = pattern.search(line)
                if match:
                    count += 1
                    if not first:
                        first, detail = line.strip(), (match.groupdict().get("detail") or "").strip()
                    break
        if count:
            found.append(Finding(sig, count, first[:300], detail[:200]))
    if any(f.signature.severity == Severity.ERROR and not f.signature.fallback for f in found):
        found = [f for f in found if not f.signature.fallback]
    return sorted(found, key=lambda f: f.signature.severity != Severity.ERROR)
