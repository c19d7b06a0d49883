"""The one streaming client of the process: explicit timeouts, retries only before the first token,
cancellation that closes the HTTP stream (vLLM then aborts the request)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, cast

import httpx2 as httpx  # openai 3.x is built on httpx2, a fork with the same API
import openai
from openai import AsyncOpenAI
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_exponential

from backend.chat.context import Message
from backend.engines.base import Api, Endpoint
from backend.engines.dialect import TokenCounter
from backend.engines.registry import dialect
from backend.errors import BackendError, PromptTooLongError, ServiceError
from backend.models.prompt_ids import PromptIds

log = logging.getLogger(__name__)


class EngineBusy(BackendError):
    """The engine answered 429 or a 5xx before the reply began: worth another try."""


# Before the first token: the connection failed, broke or timed out, or the server was busy or failing.
RETRYABLE = (httpx.TransportError, EngineBusy)
CONTEXT_WORDS = ("maximum context length", "context length", "max_model_len", "too long")


@dataclass
class StreamStats:
    """What one streamed reply measured: timings (monotonic seconds), usage, how it ended."""

    started: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    finished: float | None = None
    chunks: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    attempts: int = 0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.started

    def tokens(self, counted_prompt: int) -> tuple[int | None, int | None]:
        """(prompt, reply) tokens: the engine's usage figures; the prompt, where the engine gave none, as the request
        counted it (`counted_prompt`); None where not known."""
        return self.prompt_tokens or counted_prompt or None, self.completion_tokens

    def counted(self, counted_prompt: int) -> tuple[int, int]:
        """(prompt, reply) tokens as the quotas and the metrics count them: tokens(), with the streamed chunks for a
        reply the engine gave no usage of (one stopped or broken before its end)."""
        prompt, reply = self.tokens(counted_prompt)
        return prompt or 0, reply or self.chunks


def _is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, RETRYABLE)


async def _status_error(response: httpx.Response) -> ServiceError:
    """The error for a reply the engine refused with an HTTP status (the same as the SDK's, one step less)."""
    try:
        body = json.loads(await response.aread())
        error = body.get("error", body) if isinstance(body, dict) else body
        detail = str(error.get("message", error) if isinstance(error, dict) else error)
    except (ValueError, httpx.HTTPError):
        detail = ""
    finally:
        await response.aclose()
    return _for_status(response.status_code, detail)


def _for_status(status: int, detail: str) -> ServiceError:
    """The error for an HTTP status the engine answered with, and its message (the streamed reply's and the SDK's)."""
    if status == 400:
        if any(word in detail.lower() for word in CONTEXT_WORDS):
            return PromptTooLongError.of("context.window_exceeded")
        return BackendError.of("backend.refused", detail=detail)
    if status == 401:
        return BackendError.of("backend.auth")
    if status == 429 or status >= 500:
        return EngineBusy.of("backend.status", status=status, detail=detail)
    return BackendError.of("backend.status", status=status, detail=detail)


class StreamedBody(Protocol):
    """A response whose body arrives in pieces (httpx's and httpx2's alike)."""

    def aiter_bytes(self, chunk_size: int | None = None) -> AsyncIterator[bytes]: ...


async def event_lines(response: StreamedBody) -> AsyncGenerator[str, None]:
    """The body's lines split at "\n" only. (httpx's aiter_lines also splits at U+2028, U+0085 and other Unicode
    line breaks, which a model's text may hold raw inside one JSON event: the event then arrives cut in two.)"""
    pending = b""
    body = cast(AsyncGenerator[bytes, None], response.aiter_bytes())  # an async generator in httpx and httpx2
    async with aclosing(body) as chunks:  # closed with this generator, in its task
        async for data in chunks:
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
    if pending:
        yield pending.rstrip(b"\r").decode("utf-8", "replace")


def _broken(endpoint: Endpoint) -> ServiceError:
    """The connection to the engine broke: the app restarts an engine it runs; an external one it only waits for."""
    if endpoint.external:
        return BackendError.of("backend.broken_external", url=endpoint.base_url)
    return BackendError.of("backend.broken")


def _translate(exc: BaseException, endpoint: Endpoint) -> ServiceError:
    """Turn an openai/httpx exception into one of our errors with a message a person can act on."""
    if isinstance(exc, openai.APIStatusError):
        return _for_status(exc.status_code, str(exc.message))
    if isinstance(exc, openai.APITimeoutError | httpx.TimeoutException):
        return BackendError.of("backend.timeout")
    if isinstance(exc, openai.APIConnectionError | httpx.TransportError):
        return _broken(endpoint)
    return BackendError.of("backend.unexpected", detail=str(exc))


class ChatStream:
    """One streamed reply: iterate for text pieces; leaving early (or cancelling) closes the HTTP stream.

    The request goes out on the one HTTP client the AsyncOpenAI client uses (same pool, timeouts and key), built
    here, and the server-sent events are read here, one `json.loads` per chunk: the SDK's request building costs
    ~2 ms before the first byte and its typed chunk objects ~4x the CPU per chunk, which capped what one app
    process could stream (results/client-ceiling/client_ceiling.py, results/gpu-h200/app-path)."""

    def __init__(self, client: ChatClient, messages: list[Message], sampling: dict[str, Any]) -> None:
        self._client = client
        self._messages = messages
        self._sampling = sampling
        self._response: httpx.Response | None = None  # open while the reply streams
        self._lines: AsyncIterator[str] | None = None
        self._pieces: AsyncGenerator[str, None] | None = None  # the reply's text pieces, read from _lines
        self.stats = StreamStats()

    async def __aenter__(self) -> ChatStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP response: the engine sees the disconnect and aborts the request."""
        response, self._response, lines, self._lines = self._response, None, self._lines, None
        pieces, self._pieces = self._pieces, None
        if pieces is not None:
            await pieces.aclose()
        if isinstance(lines, AsyncGenerator):  # the body's reader too: nothing of the stream is left to the GC
            await lines.aclose()
        if response is not None:
            await response.aclose()
        if self.stats.finished is None:
            self.stats.finished = time.monotonic()

    def _absorb(self, data: str) -> str:
        """Take one event's data (a JSON chunk) into the stats; return its text."""
        self._client.last_token_at = time.monotonic()  # the engine is writing (its supervisor asks: busy or hung)
        chunk = json.loads(data)
        if "error" in chunk:  # an error the server reports inside the stream
            error = chunk["error"]
            raise BackendError.of(
                "backend.refused", detail=error.get("message", error) if isinstance(error, dict) else error
            )
        usage = chunk.get("usage")
        if usage:
            self.stats.prompt_tokens = usage.get("prompt_tokens")
            self.stats.completion_tokens = usage.get("completion_tokens")
        choices = chunk.get("choices")
        if not choices:
            return ""
        choice = choices[0]
        if choice.get("finish_reason"):
            self.stats.finish_reason = choice["finish_reason"]
        delta = choice.get("delta")  # a chat completion's; a completion (a prompt of token ids) has "text"
        return (delta.get("content") if delta else choice.get("text")) or ""

    async def _texts(self) -> AsyncGenerator[str, None]:
        """The text of each event until [DONE] or the end of the body."""
        assert self._lines is not None
        async for line in self._lines:
            if not line.startswith("data:"):
                continue  # blank separators, comments, event names
            data = line[5:].strip()
            if data == "[DONE]":
                # Read the body to its end (nothing follows but its last empty chunk): httpx's streams then end
                # by themselves. Left open, they are closed later by the garbage collector outside any task,
                # which logs "async generator ignored GeneratorExit" / "cancel scope in a different task".
                async for _ in self._lines:
                    pass
                return
            text = self._absorb(data)
            if text:
                yield text

    async def _open(self) -> str:
        """Start the request and read up to the first text; retried as a whole before any token."""
        self.stats.attempts += 1
        endpoint = self._client.endpoint
        body: dict[str, Any] = {
            "model": endpoint.model,
            "stream": True,
            "stream_options": {"include_usage": True},
            **{k: v for k, v in self._sampling.items() if k != "extra_body"},
            **self._sampling.get("extra_body", {}),  # as the SDK does: extra fields go into the body itself
        }
        path = "/v1/chat/completions"
        prompt_ids = self._client.prompt_ids
        if prompt_ids is not None and "max_tokens" in body:  # the prompt as the model's token ids (models.prompt_ids)
            body["prompt"], path = prompt_ids.ids(self._messages), "/v1/completions"
        else:
            body["messages"] = self._messages
        headers = endpoint.headers
        request = self._client.http.build_request("POST", endpoint.base_url + path, json=body, headers=headers)
        response = await self._client.http.send(request, stream=True)
        if response.status_code != 200:
            raise await _status_error(response)
        self._response = response
        self._lines = event_lines(response)
        self._pieces = pieces = self._texts()
        try:
            first = await anext(pieces, "")
            if not first and self.stats.finish_reason is None:
                # Ended with neither text nor a reason: the engine went away before the reply began (a router
                # closes the stream it was passing on), which is worth another try like a broken connection.
                raise httpx.RemoteProtocolError("the stream ended before its first token")
            return first
        except BaseException:
            await self.aclose()
            raise

    def _retrying(self, state: RetryCallState) -> None:
        # Operators count these: an engine of a fleet that died takes its waiting requests with it (docs/deployment.md).
        failure = state.outcome.exception() if state.outcome is not None else None
        log.warning(
            "Engine request failed before its first token (%s); trying again (attempt %d of %d).",
            type(failure).__name__, state.attempt_number + 1, self._client.retries + 1,
        )  # fmt: skip

    async def __aiter__(self) -> AsyncIterator[str]:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._client.retries + 1),
            wait=wait_exponential(multiplier=0.5, max=4),
            retry=retry_if_exception(_is_retryable),
            before_sleep=self._retrying,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    first = await self._open()
        except (httpx.HTTPError, ValueError) as exc:
            raise _translate(exc, self._client.endpoint) from exc
        if first:
            self.stats.first_token = time.monotonic()
            self.stats.chunks += 1
            yield first
        try:
            if self._pieces is not None:
                async for text in self._pieces:
                    if self.stats.first_token is None:
                        self.stats.first_token = time.monotonic()
                    self.stats.chunks += 1
                    yield text
        except (httpx.HTTPError, ValueError) as exc:
            # No retry here: part of the reply already reached the user.
            raise _translate(exc, self._client.endpoint) from exc
        finally:
            self.stats.finished = time.monotonic()
            await self.aclose()
        if self.stats.finish_reason is None:
            # The stream ended without saying why: the engine went away mid-reply.
            raise _broken(self._client.endpoint)


class ChatClient:
    """The process's single AsyncOpenAI client and the calls the chat makes with it."""

    def __init__(
        self,
        endpoint: Endpoint,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 120.0,
        retries: int = 2,
        max_connections: int = 256,
    ) -> None:
        self.endpoint = endpoint
        self.retries = retries
        self.last_token_at: float | None = None  # when a streamed chunk last came from the engine (time.monotonic())
        timeout = httpx.Timeout(connect=connect_timeout_s, read=read_timeout_s, write=30.0, pool=connect_timeout_s)
        self.http = httpx.AsyncClient(
            timeout=timeout,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=32),
            trust_env=False,  # the engine is on loopback: never route it through a proxy
        )
        # Set where the prompt goes as token ids, made here (ChatService.warm_up checked them against the engine's)
        self.prompt_ids: PromptIds | None = None
        # The token counter of each dialect the endpoint spoke (its api changes on a fallback to another engine)
        self._counters: dict[Api, TokenCounter] = {}
        # max_retries=0: retries live in one layer only (ChatStream), and only before the first token.
        self.openai = AsyncOpenAI(
            base_url=endpoint.base_url + "/v1",
            api_key=endpoint.api_key,
            http_client=self.http,
            max_retries=0,
            timeout=timeout,
        )

    def stream(self, messages: list[Message], **sampling: Any) -> ChatStream:
        """Return a ChatStream for `messages` with sampling settings (temperature, top_p, max_tokens, stop)."""
        return ChatStream(self, messages, {k: v for k, v in sampling.items() if v is not None})

    async def count_tokens(self, messages: list[Message]) -> int | None:
        """Count the prompt tokens of `messages` with the chat template applied (the dialect's token counter).

        None when the server has no such endpoint; the caller then estimates."""
        try:
            resp = await self._count_request(messages)
        except httpx.RemoteProtocolError:
            # A kept-alive connection the server had closed (llama-server closes them): a count is safe to ask again.
            try:
                resp = await self._count_request(messages)
            except httpx.HTTPError as exc:
                raise _translate(exc, self.endpoint) from exc
        except httpx.HTTPError as exc:
            raise _translate(exc, self.endpoint) from exc
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise BackendError.of("backend.count_failed", status=resp.status_code, detail=resp.text[:200])
        count = self._counter().count_of(resp.json())
        # No tokens for a conversation: a server that read another body shape (llama-server's /tokenize wants
        # "content", and a router passes it a chat): as good as no endpoint, so the caller estimates.
        return None if count == 0 and messages else count

    async def _count_request(self, messages: list[Message]) -> httpx.Response:
        """The request(s) that count `messages` in the endpoint's dialect: /tokenize's response, or a 404."""
        response: httpx.Response = await self._counter().request(messages)
        return response

    def _counter(self) -> TokenCounter:
        """The token counter of the dialect the endpoint speaks now (made once per dialect)."""
        api = self.endpoint.api
        if api not in self._counters:
            self._counters[api] = dialect(api).counter(self.http, self.endpoint)
        return self._counters[api]

    async def engine_ids(self, messages: list[Message]) -> list[int] | None:
        """The token ids the engine's own chat template gives `messages` (its counter's); None where it cannot say."""
        try:
            resp = await self._count_request(messages)
            return self._counter().ids_of(resp.json()) if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def forget_templates(self) -> None:
        """Drop what the counters learned of the chat template (another model, another template, answers now)."""
        for counter in self._counters.values():
            counter.forget()

    async def max_model_len(self) -> int | None:
        """The context window the server reports for our model (vLLM's /v1/models), if it says."""
        try:
            models = await self.openai.models.list()
        except openai.OpenAIError as exc:
            raise _translate(exc, self.endpoint) from exc
        for model in models.data:
            if model.id == self.endpoint.model:
                value = getattr(model, "max_model_len", None)
                return int(value) if value else None
        return None

    async def aclose(self) -> None:
        await self.openai.close()
