"""Known failure signatures in the engine's log, each with its cause and its fix: scanning a log for them.

The signatures are the engines' own (Engine.log_signatures, declared in each engine module: vLLM's in
backend/engines/vllm.py); this module finds them in a log. tests/unit/data/engine_logs holds real samples.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from backend.engines.base import Severity, Signature
from backend.engines.registry import log_signatures

START_MARK = re.compile(r"^===== .* starting: ", re.MULTILINE)  # written by Supervisor before each start


# Every engine's known failures (each engine module declares its own: Engine.log_signatures), in one scan: the log
# may be any engine's (engine.name auto, an engine.json of another start).
SIGNATURES: tuple[Signature, ...] = log_signatures()


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
