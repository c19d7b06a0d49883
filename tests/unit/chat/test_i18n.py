"""Errors in the chat's language: catalogued ones in Chinese for zh-CN, free-form ones in English."""

from __future__ import annotations

import re

import httpx2 as httpx
import pytest
from openai import AsyncOpenAI

from backend.chat.client import ChatClient, Endpoint
from backend.chat.context import fit_history
from backend.chat.i18n import describe, describe_parts, t
from backend.errors import BackendError, EngineStartError, PromptTooLongError, ServiceError

CJK = re.compile(r"[\u4e00-\u9fff]")


def test_catalogued_error_is_chinese_for_zh_and_english_otherwise() -> None:
    exc = EngineStartError.of("engine.not_ready", seconds=900.0)
    assert (
        describe(exc, "zh-CN")
        == "推理引擎在 900 秒内没有就绪。如果机器较慢，请调大 timeouts.startup_s，或查看日志末尾。"
    )
    assert describe(exc, "en-US") == str(exc) == describe(exc, None)
    assert t("error", "zh-CN", error=describe(exc, "zh-CN")).startswith("⚠️ 出错了：推理引擎在 900 秒内没有就绪。")


def test_english_only_error_stays_english() -> None:
    exc = ServiceError("The benchmark server did not answer.", "Check --url.")
    assert describe(exc, "zh-CN") == "The benchmark server did not answer. Check --url."
    assert describe(RuntimeError("boom"), "zh-CN") == "boom"
    assert describe(None, "zh-CN") == "" and describe("plain text", "zh-CN") == "plain text"


def test_message_and_hint_apart_for_the_failed_notice() -> None:
    problem = EngineStartError.of("engine.port_in_use", port=8100, host="127.0.0.1")
    error, hint = describe_parts(problem, "zh-CN")
    assert error == "127.0.0.1 上的端口 8100 已被其他程序占用。" and CJK.search(hint)
    assert describe_parts(problem, "en") == (problem.message, problem.hint)
    notice = t("failed", "zh-CN", error=error, hint=hint)
    assert notice.startswith("❌ 模型服务无法启动：127.0.0.1 上的端口 8100 已被其他程序占用。\n\n请停止该程序")
    assert describe_parts(ServiceError("Free-form.", "Do this."), "zh-CN") == ("Free-form.", "Do this.")
    assert describe_parts(None, "zh-CN") == ("", "") and describe_parts("text", "zh") == ("text", "")


async def _words(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"].split()) for m in messages)


async def test_a_message_too_long_for_the_window_reads_in_chinese() -> None:
    with pytest.raises(PromptTooLongError) as caught:
        await fit_history([], {"role": "user", "content": "word " * 50}, _words, budget=10)
    exc = caught.value
    assert exc.params == {"tokens": 50, "budget": 10}
    assert "50 tokens but only 10 fit" in str(exc)
    text = describe(exc, "zh-CN")
    assert text.startswith("您的消息需要 50 个 token，但模型的上下文窗口只能容纳 10 个")
    assert "max tokens" in text and CJK.search(text)


def _client(handler: httpx.MockTransport) -> ChatClient:
    client = ChatClient(Endpoint("http://engine", "key", "m"), retries=0)
    client.http = httpx.AsyncClient(transport=handler)
    client.openai = AsyncOpenAI(base_url="http://engine/v1", api_key="key", http_client=client.http, max_retries=0)
    return client


def _failing(status: int, body: str) -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(status, json={"error": {"message": body}}))


async def test_an_engine_error_during_a_reply_reads_in_chinese() -> None:
    client = _client(_failing(500, "CUDA out of memory"))
    with pytest.raises(BackendError) as caught:
        async with client.stream([{"role": "user", "content": "hi"}], max_tokens=8) as stream:
            async for _ in stream:
                pass
    await client.aclose()
    exc = caught.value
    assert exc.code == "backend.status" and exc.params["status"] == 500
    assert "The engine answered with an error (500)" in str(exc)
    text = describe(exc, "zh-CN")
    assert text.startswith("推理引擎返回了错误（500）：") and "CUDA out of memory" in text
    assert text.endswith("请稍后重试；如果反复出现，请查看引擎日志。")
    assert t("error", "zh-CN", error=text).startswith("⚠️ 出错了：推理引擎返回了错误")


async def test_a_failed_token_count_reads_in_chinese() -> None:
    client = _client(_failing(500, "tokenizer crashed"))
    with pytest.raises(BackendError) as caught:
        await client.count_tokens([{"role": "user", "content": "hi"}])
    await client.aclose()
    assert caught.value.hint  # it used to have none
    assert describe(caught.value, "zh-CN").startswith("统计 token 数失败（500）：")


async def test_a_context_overflow_from_the_engine_reads_in_chinese() -> None:
    client = _client(_failing(400, "This model's maximum context length is 4096 tokens."))
    with pytest.raises(PromptTooLongError) as caught:
        async with client.stream([{"role": "user", "content": "hi"}]) as stream:
            async for _ in stream:
                pass
    await client.aclose()
    assert (
        describe(caught.value, "zh-CN")
        == "对话超出了模型的上下文窗口。请缩短消息，或在设置中调低最大生成长度（max tokens）。"
    )
