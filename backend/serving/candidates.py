"""The candidate ladder: the ways to run the engine, best first, and which were rejected on this start and why."""

from __future__ import annotations

import logging

from backend.engines.base import Candidate
from backend.errors import CanaryError

log = logging.getLogger(__name__)


class CandidateLadder:
    """The ordered candidates of one run; a rejected one gives way to the next (or every one of its engine)."""

    def __init__(self, candidates: list[Candidate], cpu: str) -> None:
        if not candidates:
            raise CanaryError.of("canary.no_candidate")
        self.candidates = candidates
        self.cpu = cpu  # the CPU the verdicts hold for, named when none is left
        self.index = 0
        self.rejected: list[str] = []  # "candidate: why", in the order they were tried

    @property
    def current(self) -> Candidate:
        return self.candidates[self.index]

    def reject(self, reason: str) -> Candidate:
        """Drop the current candidate for `reason` and move to the next; raise CanaryError when none is left."""
        failed = self.current.label
        self.rejected.append(f"{failed}: {reason}")
        log.warning("Rejected %s: %s", failed, reason)
        if self.index + 1 >= len(self.candidates):
            raise CanaryError.of("canary.none_passed", cpu=self.cpu, tried=list(self.rejected))
        self.index += 1
        log.warning("Falling back to %s", self.current.label)
        return self.current

    def has_other_engine(self) -> bool:
        """Whether a later candidate runs another engine (engine.name auto: llama.cpp, then vllm-cpu)."""
        return any(c.engine != self.current.engine for c in self.candidates[self.index + 1 :])

    def reject_engine(self, reason: str) -> Candidate:
        """Drop every remaining candidate of the current engine (it cannot run at all) for the next engine's."""
        engine = self.current.engine
        self.rejected.append(f"{engine}: {reason}")
        log.warning("Not using %s: %s", engine, reason)
        if not self.has_other_engine():
            raise CanaryError.of("canary.engine_none_passed", cpu=self.cpu, tried=list(self.rejected))
        while self.current.engine == engine:
            self.index += 1
        log.warning("Falling back to %s", self.current.label)
        return self.current
