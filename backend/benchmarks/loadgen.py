"""Sending benchmark requests: plain streaming HTTP, or the app's own client path, at a fixed concurrency.

The raw sender measures exactly as `vllm bench serve` does (a timestamp per SSE chunk with choices,
token counts from the usage chunk). The app sender goes through backend.chat.client.ChatClient.stream and
backend.chat.pacing.paced, as a chat reply does, and times the pieces the chat would show.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from backend.benchmarks.stats import LevelMetrics, RequestResult
from backend.benchmarks.workload import BenchRequest
from backend.chat.client import ChatClient
from backend.chat.pacing import paced

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
        self.headers = {"Authorization": f"Bearer {api_key}"}
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
        result = RequestResult(success=False)
        start = time.perf_counter()
        last = start
        first = True
        token_chunks = 0
        try:
            async with self.http.stream("POST", self.url, json=body, headers=self.headers) as resp:
                if resp.status_code != 200:
                    detail = (await resp.aread()).decode("utf-8", "replace")
                    result.error = f"HTTP {resp.status_code}: {detail}"[:ERROR_CHARS]
                    return result
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # blank separators and SSE comments
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    now = time.perf_counter()
                    data = json.loads(payload)
                    if "error" in data:
                        result.error = f"stream error: {data['error']}"[:ERROR_CHARS]
                        return result
                    if choices := data.get("choices"):
                        content = (choices[0].get("delta") or {}).get("content")
                        if first:
                            result.ttft = now - start
                            first = False
                        else:
                            result.itl.append(now - last)
                        if content is not None:
                            token_chunks += 1  # one token per chunk, text or not (a partial UTF-8 byte)
                        if content:
                            if result.first_text is None:
                                result.first_text = now - start
                        last = now
                    elif usage := data.get("usage"):
                        result.output_tokens = int(usage.get("completion_tokens") or 0)
                        result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        except (httpx.HTTPError, ValueError) as exc:
            result.error = _error(exc)
            return result
        if first:
            result.error = "the stream ended without any chunk"
            return result
        result.success = True
        result.latency = last - start
        if not result.output_tokens:
            result.output_tokens = token_chunks  # a server without usage counts: one token per chunk
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
