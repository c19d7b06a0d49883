"""What the streaming client sends: the chat request's JSON body, as a local HTTP server receives it."""

from __future__ import annotations

import asyncio
from typing import Any

from backend.chat.client import ChatClient
from tests.deadlines import HANG_S
from tests.stub_engine import stream
from tests.unit.chat.test_client_retry import endpoint, scripted

MESSAGES = [{"role": "user", "content": "hi"}]


async def sent(**sampling: Any) -> dict[str, Any]:
    """The body the client sends for one reply with `sampling`."""
    async with scripted(stream("ok")) as server:
        client = ChatClient(endpoint(server), connect_timeout_s=2.0)
        try:
            async with client.stream(MESSAGES, **sampling) as s:
                pieces = await asyncio.wait_for(_all(s), HANG_S)
        finally:
            await client.aclose()
    assert pieces == ["ok"] and s.stats.finish_reason == "stop"
    [body] = server.requests
    return body


async def _all(stream: Any) -> list[str]:
    return [piece async for piece in stream]


async def test_the_request_streams_with_usage_and_carries_the_sampling_settings() -> None:
    body = await sent(max_tokens=7, temperature=0.5, top_p=0.8, stop=["\n\n"])
    assert (body["model"], body["messages"], body["stream"]) == ("m", MESSAGES, True)
    assert body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["stop"]) == (7, 0.5, 0.8, ["\n\n"])


async def test_engine_parameters_given_as_extra_body_are_fields_of_the_request() -> None:
    body = await sent(max_tokens=7, extra_body={"ignore_eos": True, "min_tokens": 7})
    assert (body.get("ignore_eos"), body.get("min_tokens")) == (True, 7), body
    assert "extra_body" not in body, body


class OwnIds:
    """The app's own prompt ids (backend.models.prompt_ids.PromptIds), as the client uses them."""

    def ids(self, messages: list[dict[str, str]]) -> list[int]:
        assert messages == MESSAGES
        return [7, 8, 9]


async def test_a_prompt_of_the_models_own_ids_goes_to_completions_and_its_text_is_read() -> None:
    async with scripted(stream("o", "k")) as server:  # a completion's stream: its text in `text`
        client = ChatClient(endpoint(server), connect_timeout_s=2.0)
        client.prompt_ids = OwnIds()  # type: ignore[assignment]
        try:
            async with client.stream(MESSAGES, max_tokens=7, temperature=0.5) as s:
                pieces = await asyncio.wait_for(_all(s), HANG_S)
        finally:
            await client.aclose()
    assert (pieces, s.stats.finish_reason, s.stats.completion_tokens) == (["o", "k"], "stop", 2)
    [body] = server.requests
    assert server.paths == ["/v1/completions"]
    assert (body["prompt"], body["max_tokens"], body["temperature"], body["stream"]) == ([7, 8, 9], 7, 0.5, True)
    assert "messages" not in body
