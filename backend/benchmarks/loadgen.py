"""Sending benchmark requests: plain streaming HTTP, or the app's own client path, at a fixed concurrency.

The raw sender measures exactly as `vllm bench serve` does (a timestamp per SSE chunk with choices,
token counts from the usage chunk); its stream reader, stream_chat, serves the chat workload too. The app
sender goes through backend.chat.client.ChatClient.stream and backend.chat.pacing.paced, as a chat reply
does, and times the pieces the chat would show.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import httpx

from backend.benchmarks.stats import LevelMetrics, RequestResult
from backend.benchmarks.workload import BenchRequest
from backend.chat.client import ChatClient, event_lines
from backend.chat.pacing import paced
from backend.engines.base import bearer

Sender = Callable[[BenchRequest], Awaitable[RequestResult]]
ERROR_CHARS = 300


@dataclass(frozen=True)
class Sampling:
    """Sampling settings every request of a run shares."""

    temperature: float
    top_p: float
    ignore_eos: bool = True

    def body(self, max_tokens: int) -> dict[str, Any]:
        """Request fields; ignore_eos/min_tokens (vLLM extras) fix the output length."""
        fields: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": max_tokens}
        if self.ignore_eos:
            fields.update(ignore_eos=True, min_tokens=max_tokens)
        return fields


@dataclass
class LevelRun:
    """One level of one dataset: what was sent and what came back."""

    requests: list[BenchRequest]
    results: list[RequestResult]
    metrics: LevelMetrics


def _error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text[:ERROR_CHARS]


@dataclass
class Streamed:
    """One streamed chat completion as it arrived: perf_counter times of its chunks, its text, its usage counts."""

    start: float
    chunk_times: list[float] = field(default_factory=list)  # every chunk with choices but the opening role chunk
    first_text_at: float | None = None  # the first chunk with non-empty text
    opened_at: float | None = None  # OpenAI's opening chunk (role, no text), where the server sent one
    text: list[str] = field(default_factory=list)
    token_chunks: int = 0  # chunks with content, text or not (one token each)
    prompt_tokens: int = 0
    completion_tokens: int = 0  # from the usage chunk; 0 where the server sent none
    # Prompt tokens the server took from its prefix cache instead of computing (OpenAI's
    # usage.prompt_tokens_details.cached_tokens, llama-server's timings.cache_n); None where it says nothing.
    cached_tokens: int | None = None
    error: str | None = None


async def stream_chat(http: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, Any]) -> Streamed:
    """POST a streaming chat completion and record its server-sent events; a failure is in `error`, never raised."""
    streamed = Streamed(start=time.perf_counter())
    try:
        async with http.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                detail = (await resp.aread()).decode("utf-8", "replace")
                streamed.error = f"HTTP {resp.status_code}: {detail}"[:ERROR_CHARS]
                return streamed
            # Read to the body's end, past [DONE] or an error event (the server ends the body right after them): a
            # body left half read leaves httpcore's own iterator to the garbage collector, which finalises it in
            # another task ("async generator ignored GeneratorExit", "cancel scope in a different task").
            ended = False
            async with aclosing(event_lines(resp)) as lines:
                async for line in lines:
                    if ended or not line.startswith("data:"):
                        continue  # blank separators, SSE comments, anything after the end
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        ended = True
                        continue
                    now = time.perf_counter()
                    data = json.loads(payload)
                    if "error" in data:
                        streamed.error = f"stream error: {data['error']}"[:ERROR_CHARS]
                        ended = True
                        continue
                    if choices := data.get("choices"):
                        delta = choices[0].get("delta") or {}
                        content = delta.get("content")
                        if "role" in delta and not content:
                            # OpenAI's opening chunk (role, no text): a server may send it before any token
                            streamed.opened_at = streamed.opened_at or now
                            continue
                        streamed.chunk_times.append(now)
                        if content is not None:
                            streamed.token_chunks += 1  # one token per chunk, text or not (a partial UTF-8 byte)
                        if content:
                            streamed.text.append(content)
                            if streamed.first_text_at is None:
                                streamed.first_text_at = now
                    elif usage := data.get("usage"):
                        streamed.completion_tokens = int(usage.get("completion_tokens") or 0)
                        streamed.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                        if cached is not None:
                            streamed.cached_tokens = int(cached)
                    if (timings := data.get("timings")) and "cache_n" in timings:
                        streamed.cached_tokens = int(timings["cache_n"])
    except (httpx.HTTPError, ValueError) as exc:
        streamed.error = _error(exc)
        return streamed
    if not streamed.chunk_times and streamed.error is None:
        streamed.error = "the stream ended without any chunk"
    return streamed


class RawSender:
    """Streams /v1/chat/completions over plain HTTP and parses the server-sent events itself."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        sampling: Sampling,
        timeout_s: float = 600.0,
        connections: int = 64,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/v1/chat/completions"
        self.headers = bearer(api_key)
        self.model = model
        self.sampling = sampling
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
            trust_env=False,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __call__(self, request: BenchRequest) -> RequestResult:
        body = {
            "model": self.model,
            "messages": request.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.sampling.body(request.max_tokens),
        }
        streamed = await stream_chat(self.http, self.url, self.headers, body)
        result = RequestResult(success=False)
        if streamed.error is not None:
            result.error = streamed.error
            return result
        times = streamed.chunk_times
        result.success = True
        result.ttft = times[0] - streamed.start
        result.itl = [later - earlier for earlier, later in pairwise(times)]
        result.latency = times[-1] - streamed.start
        if streamed.first_text_at is not None:
            result.first_text = streamed.first_text_at - streamed.start
        result.prompt_tokens = streamed.prompt_tokens
        # A server without usage counts: one token per chunk.
        result.output_tokens = streamed.completion_tokens or streamed.token_chunks
        return result


class AppSender:
    """Streams through the app's ChatClient and pacing, timing the pieces a chat reply would show."""

    def __init__(self, client: ChatClient, sampling: Sampling, flush_s: float) -> None:
        self.client = client
        self.sampling = sampling
        self.flush_s = flush_s

    async def __call__(self, request: BenchRequest) -> RequestResult:
        fields = self.sampling.body(request.max_tokens)
        extra = {k: fields.pop(k) for k in ("ignore_eos", "min_tokens") if k in fields}
        result = RequestResult(success=False)
        start = time.perf_counter()
        last = start
        try:
            stream = self.client.stream(request.messages, extra_body=extra or None, **fields)
            async with stream:
                async for _piece in paced(stream, self.flush_s):
                    now = time.perf_counter()
                    if result.first_text is None:
                        result.ttft = result.first_text = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
        except Exception as exc:  # any failure is a failed request, never a crashed benchmark
            result.error = _error(exc)
            return result
        if result.first_text is None:
            result.error = "the reply held no text"
            return result
        result.success = True
        result.latency = last - start
        result.output_tokens = stream.stats.completion_tokens or stream.stats.chunks
        result.prompt_tokens = stream.stats.prompt_tokens or 0
        return result


async def run_level(
    send: Sender, requests: Sequence[BenchRequest], concurrency: int, on_done: Callable[[], None] | None = None
) -> tuple[list[RequestResult], float]:
    """Send `requests` with at most `concurrency` in flight (a closed loop); return results and wall time."""
    results: list[RequestResult | None] = [None] * len(requests)
    order = iter(range(len(requests)))

    async def worker() -> None:
        for index in order:  # the iterator is shared: each index goes to one worker
            results[index] = await send(requests[index])
            if on_done is not None:
                on_done()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(requests))))))
    duration = time.perf_counter() - start
    return [r for r in results if r is not None], duration
