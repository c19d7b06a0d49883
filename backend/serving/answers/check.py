"""Asking a running engine for its rendering and log-probabilities of the reference's prompts, in its dialect."""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from backend.engines.base import Api, bearer
from backend.engines.dialect import EngineAnswerError, LogprobSource
from backend.engines.registry import dialect
from backend.errors import BackendError
from backend.serving.answers.comparison import Observed, Verdict, compare
from backend.serving.answers.reference import PromptReference, Reference
from backend.serving.answers.tolerance import Tolerance

log = logging.getLogger(__name__)


class LogprobCheckError(BackendError):
    """The check could not run: the engine is unreachable (connection refused, timeout)."""


async def observe(source: LogprobSource, reference: Reference) -> Observed:
    """Ask the engine for its rendering and log-probabilities of every reference prompt (all prompts at once:
    the engines batch them, and llama-server's one-request-per-position steps then share each decode step)."""
    observed = Observed()

    async def one(prompt: PromptReference) -> None:
        try:
            observed.prompt_ids[prompt.name] = await source.render(prompt.messages)
            observed.positions[prompt.name] = await source.positions(
                prompt.prompt_ids, prompt.continuation_ids, reference.top
            )
        except EngineAnswerError as exc:
            observed.errors[prompt.name] = exc.message

    await asyncio.gather(*(one(p) for p in reference.prompts))
    return observed


async def check_engine(
    base_url: str,
    api_key: str,
    served_name: str,
    api: Api,
    reference: Reference,
    tolerance: Tolerance,
    timeout_s: float = 120.0,
) -> Verdict:
    """Check the engine at `base_url` (root, without /v1) against `reference`; an engine that answers with an HTTP
    error gives a failed Verdict. Raises LogprobCheckError (only) when the engine cannot be reached."""
    started = time.monotonic()
    headers = bearer(api_key)
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        async with httpx.AsyncClient(
            base_url=root, headers=headers, timeout=httpx.Timeout(timeout_s), trust_env=False
        ) as http:
            observed = await observe(dialect(api).logprob_source(http, served_name), reference)
    except httpx.HTTPError as exc:
        raise LogprobCheckError(
            f"The engine at {root} could not be reached for the log-probability check: {type(exc).__name__}: {exc}",
            "Is it running and ready?",
        ) from exc
    verdict = compare(reference, observed, tolerance)
    verdict.stats.seconds = round(time.monotonic() - started, 3)
    log.info("log-probability check of %s (%s): %s", served_name, api, verdict.reason)
    return verdict
