"""`python -m backend check-answers REFERENCE.json [--url URL] [--key KEY] [--api vllm|llama.cpp] [--format F]`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from backend.engines.base import Api
from backend.serving.answers.check import check_engine
from backend.serving.answers.reference import Reference
from backend.serving.answers.tolerance import tolerance_for


def check_answers_command(
    url: str, key: str, name: str, api: Api, reference_file: Path, number_format: str, timeout_s: float
) -> int:
    """`check-answers`: check a running engine against a reference file; print the verdict as JSON (exit 1: fails)."""
    reference = Reference.load(reference_file)
    verdict = asyncio.run(check_engine(url, key, name, api, reference, tolerance_for(number_format), timeout_s))
    print(json.dumps({**verdict.to_dict(), "format": number_format, "reference_seconds": reference.seconds}, indent=1))
    return 0 if verdict.passed else 1
