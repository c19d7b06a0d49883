"""The load generator: SSE parsing as vllm bench serve does it, failures as results, the closed loop."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from backend.benchmarks.loadgen import RawSender, Sampling, run_level, stream_chat
from backend.benchmarks.stats import RequestResult
from backend.benchmarks.workload import BenchRequest

REQUEST = BenchRequest([{"role": "user", "content": "你好"}], 4, "t")


def sse(*events: dict[str, Any] | str) -> bytes:
    lines = [f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events]
    return ("".join(lines)).encode()


def chunk(content: str | None, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}


def sender(handler: Any, sampling: Sampling | None = None) -> RawSender:
    return RawSender("http://engine", "k", "m", sampling or Sampling(0.7, 0.9), transport=httpx.MockTransport(handler))


async def test_stream_is_measured_per_chunk_with_usage_counts() -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        assert request.headers["authorization"] == "Bearer k"
        body = sse(
            chunk(""),  # vLLM's first chunk: the role, no text
            chunk("你"),
            chunk(""),  # half a UTF-8 character: no text yet
            chunk("好", "length"),
            {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}},
            "[DONE]",
        )
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    send = sender(handler)
    result = await send(REQUEST)
    await send.aclose()
    assert result.success, result.error
    assert (result.output_tokens, result.prompt_tokens) == (4, 9)
    assert len(result.itl) == 3  # four chunks with choices
    assert result.first_text is not None and result.first_text >= result.ttft
    assert result.latency >= result.ttft + sum(result.itl) * 0.999
    body = seen[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["min_tokens"], body["ignore_eos"]) == (4, 4, True)
    assert (body["temperature"], body["top_p"], body["model"]) == (0.7, 0.9, "m")


async def test_the_opening_role_chunk_is_not_a_token() -> None:
    """OpenAI's opening chunk (role, empty text; the app's API sends it on accepting the request) is not timed."""

    def handler(request: httpx.Request) -> httpx.Response:
        opening = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
        body = sse(opening, chunk("a"), chunk(""), chunk("b", "length"), "[DONE]")  # no usage: a token per chunk
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    send = sender(handler)
    result = await send(REQUEST)
    await send.aclose()
    assert result.success, result.error
    assert result.output_tokens == 3 and len(result.itl) == 2
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        streamed = await stream_chat(http, "http://engine/v1/chat/completions", {}, {})
    assert streamed.opened_at is not None and streamed.first_text_at is not None
    assert streamed.start <= streamed.opened_at <= streamed.chunk_times[0], "kept apart, before the first token"


async def test_without_ignore_eos_no_vllm_extras_are_sent() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, content=sse(chunk("a"), chunk("b"), "[DONE]"))

    result = await sender(handler, Sampling(0.0, 1.0, ignore_eos=False))(REQUEST)
    assert "ignore_eos" not in bodies[0] and "min_tokens" not in bodies[0]
    assert result.success and result.output_tokens == 2  # no usage chunk: one token per text chunk


@pytest.mark.parametrize(
    ("response", "error"),
    [
        (httpx.Response(400, text='{"message": "max_tokens too large"}'), "HTTP 400"),
        (httpx.Response(200, content=sse({"error": {"message": "engine died"}})), "stream error"),
        (httpx.Response(200, content=sse("[DONE]")), "without any chunk"),
    ],
)
async def test_failures_become_failed_results(response: httpx.Response, error: str) -> None:
    result = await sender(lambda request: response)(REQUEST)
    assert not result.success
    assert error in result.error


async def test_connection_errors_become_failed_results() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    result = await sender(handler)(REQUEST)
    assert not result.success and "ConnectError" in result.error


async def test_run_level_keeps_the_concurrency_and_the_order() -> None:
    in_flight = peak = 0
    done: list[int] = []
    first_sent = last_done = 0.0

    async def send(request: BenchRequest) -> RequestResult:
        nonlocal in_flight, peak, first_sent, last_done
        first_sent = first_sent or time.perf_counter()
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0)  # let the other senders in
        in_flight -= 1
        last_done = time.perf_counter()
        return RequestResult(True, output_tokens=int(request.label))

    requests = [BenchRequest([], 1, str(i)) for i in range(10)]
    before = time.perf_counter()
    results, duration = await run_level(send, requests, 3, on_done=lambda: done.append(1))
    after = time.perf_counter()
    assert peak == 3
    assert [r.output_tokens for r in results] == list(range(10))
    assert len(done) == 10
    # The level's duration spans its requests, from the first sent to the last answered, inside the call.
    assert last_done - first_sent <= duration <= after - before
