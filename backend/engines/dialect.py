"""An engine's dialect: what its server says beside the OpenAI API, where servers differ.

How a server counts a conversation's prompt tokens (the chat's context window), gives the log-probabilities of
fixed token ids (the answer check, backend.serving.answers), is recognised when it runs outside the app (the
benchmark) and names its load on /metrics (the doctor). The engine module whose server speaks a dialect defines it
(engines/vllm.py, engines/llamacpp.py); backend.engines.registry maps `Api` to it, so callers never ask which
server they talk to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from backend.engines.base import Api, Endpoint
from backend.errors import BackendError

TokenLogprob = tuple[int, float]


class Reply(Protocol):
    """What a dialect reads of an HTTP response (httpx's and httpx2's alike)."""

    @property
    def status_code(self) -> int: ...

    @property
    def text(self) -> str: ...

    def json(self, **kwargs: Any) -> Any: ...


class Http(Protocol):
    """The HTTP client a dialect's requests go through (httpx's or httpx2's AsyncClient)."""

    async def post(self, url: str, *, json: Any = None, headers: Mapping[str, str] | None = None) -> Any: ...

    async def get(self, url: str, *, headers: Mapping[str, str] | None = None) -> Any: ...


@dataclass(frozen=True)
class Position:
    """One continuation position: the top (token id, log-prob) pairs, best first, and the chosen token's log-prob."""

    top: list[TokenLogprob]
    chosen_logprob: float | None = None


ANSWER_HINT = (
    "The answer check cannot read this engine's answers: see the engine log, or turn the check off with "
    "canary.enabled: false in config/backend.yaml."
)


class EngineAnswerError(BackendError):
    """The engine answered, but with an HTTP error or a body the check cannot read (becomes a failed Verdict)."""


async def post_json(http: Http, path: str, body: dict[str, Any]) -> Any:
    """POST JSON; an HTTP error or an unreadable body becomes EngineAnswerError, transport errors pass through."""
    response: Reply = await http.post(path, json=body)
    if response.status_code >= 400:
        raise EngineAnswerError(f"POST {path} answered HTTP {response.status_code}: {response.text[:300]}", ANSWER_HINT)
    try:
        return response.json()
    except ValueError as exc:
        raise EngineAnswerError(
            f"POST {path} answered with a body that is not JSON: {response.text[:200]!r}", ANSWER_HINT
        ) from exc


def token_list(data: Any, path: str) -> list[int]:
    """The token ids of a /tokenize answer; EngineAnswerError when it holds none."""
    try:
        return [int(t) for t in data["tokens"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineAnswerError(f"{path} gave no token list: {str(data)[:200]}", ANSWER_HINT) from exc


class LogprobSource:
    """How one server renders chat messages and gives the log-probabilities of fixed token ids."""

    def __init__(self, http: Http, served_name: str) -> None:
        self.http = http
        self.model = served_name

    async def render(self, messages: list[dict[str, str]]) -> list[int]:
        """The token ids the engine's own chat template gives for `messages` (generation prompt added)."""
        raise NotImplementedError

    async def positions(self, prompt_ids: list[int], continuation_ids: list[int], k: int) -> list[Position]:
        """For each continuation token, the engine's top-k of the distribution that predicts it (teacher forced)."""
        raise NotImplementedError


@dataclass(frozen=True)
class LoadMetrics:
    """The Prometheus sample names of a server's load on its /metrics (the doctor reads them)."""

    running: str  # replies being computed
    waiting: str  # replies waiting for a place
    cache_usage: str  # the KV cache's use, 0-1
    preemptions: str  # replies preempted so far (a counter)


class TokenCounter:
    """How one client asks a server for a conversation's prompt tokens (it may keep what it learns: `forget`)."""

    def __init__(self, http: Http, endpoint: Endpoint) -> None:
        self.http = http
        self.endpoint = endpoint

    async def request(self, messages: list[dict[str, str]]) -> Any:
        """The response that holds the count ({"count"} or {"tokens"}), or a 404 where the server cannot count."""
        raise NotImplementedError

    def forget(self) -> None:
        """Drop what was learned about the chat template (another model or template answers now)."""

    def count_of(self, data: Any) -> int:
        """The token count in a 200 answer of `request` (KeyError, TypeError or ValueError where it holds none).

        Both shapes servers answer with: {"count": n, ...} (vLLM's /tokenize), or only {"tokens": [...]}."""
        return int(data["count"]) if "count" in data else len(data["tokens"])

    def ids_of(self, data: Any) -> list[int] | None:
        """The token ids in a 200 answer of `request` ({"tokens": [...]}); None where it holds none."""
        tokens = data.get("tokens") if isinstance(data, dict) else None
        try:
            return [int(t) for t in tokens] if isinstance(tokens, list) else None
        except (TypeError, ValueError):
            return None


class Dialect:
    """One server dialect; subclasses set `api`, their token counter and their log-probability source."""

    api: ClassVar[Api]
    # Whether its /v1/completions takes a prompt of token ids and its /tokenize renders messages (the chat then may
    # send a prompt as the model's token ids, made in the app: backend.models.prompt_ids)
    takes_ids: ClassVar[bool] = False
    counter_type: ClassVar[type[TokenCounter]]
    logprobs_type: ClassVar[type[LogprobSource]]
    # Its own endpoints and request fields beside the OpenAI API: only its module says them (tests/unit/engines)
    words: ClassVar[frozenset[str]] = frozenset()
    # The prefix of its own Prometheus metrics on /metrics ("vllm:"), and those that tell its load (None: none read)
    metric_prefix: ClassVar[str | None] = None
    load_metrics: ClassVar[LoadMetrics | None] = None

    def counter(self, http: Http, endpoint: Endpoint) -> TokenCounter:
        """A token counter for one client (`http` carries no key: requests carry `endpoint.headers`)."""
        return self.counter_type(http, endpoint)

    def logprob_source(self, http: Http, served_name: str) -> LogprobSource:
        """The answer check's source (`http` has the server's root as base URL and carries the key)."""
        return self.logprobs_type(http, served_name)

    async def recognizes(self, http: Http, root: str, headers: Mapping[str, str]) -> bool:
        """Whether the server at `root` speaks this dialect (the benchmark's external server; the generic: False)."""
        return False
