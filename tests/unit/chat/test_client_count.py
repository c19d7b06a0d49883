"""Counting a prompt's tokens on llama-server: /apply-template then /tokenize, and one request for a message after
a conversation head the client rendered before (the template's probe, backend.engines.llamacpp)."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx2 as httpx
import pytest
from openai import AsyncOpenAI

from backend.chat.client import ChatClient, Message
from backend.engines.base import Api, Endpoint
from backend.errors import BackendError
from tests.stub_engine import StubEngine


def chatml(messages: list[Message]) -> str:
    rendered = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return rendered + "<|im_start|>assistant\n"


class LlamaServer:
    """llama-server's two endpoints: `render` is its chat template; a token is a word or a marker."""

    def __init__(self, render: Callable[[list[Message]], str] = chatml) -> None:
        self.render = render
        self.paths: list[str] = []
        self.tokenized: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        body = json.loads(request.content)
        if request.url.path == "/apply-template":
            return httpx.Response(200, json={"prompt": self.render(body["messages"])})
        self.tokenized.append(body["content"])
        return httpx.Response(200, json={"tokens": list(range(len(body["content"].split())))})


def client_of(server: LlamaServer) -> ChatClient:
    client = ChatClient(Endpoint("http://engine", "key", "m", Api.LLAMACPP), retries=0)
    client.http = httpx.AsyncClient(transport=httpx.MockTransport(server))
    client.openai = AsyncOpenAI(base_url="http://engine/v1", api_key="key", http_client=client.http, max_retries=0)
    return client


async def test_a_message_after_a_rendered_head_costs_one_request() -> None:
    server = LlamaServer()
    client = client_of(server)
    system = {"role": "system", "content": "be brief"}
    first = [system, {"role": "user", "content": "hello there"}]
    assert await client.count_tokens(first) == len(chatml(first).split())
    assert server.paths == ["/apply-template", "/tokenize"]
    server.paths.clear()
    for text in ("  spaces kept  ", "a\nnew line", "ünïcode 你好 \\1 back\\slash"):
        message = [system, {"role": "user", "content": text}]
        assert await client.count_tokens(message) == len(chatml(message).split())
        assert server.tokenized[-1] == chatml(message), "the prompt the template renders, exactly"
    assert server.paths == ["/tokenize"] * 3
    await client.aclose()


async def test_a_template_that_changes_the_text_is_asked_every_time() -> None:
    server = LlamaServer(lambda messages: chatml([{**m, "content": m["content"].strip()} for m in messages]))
    client = client_of(server)
    message = [{"role": "user", "content": " padded "}]
    for _ in range(2):
        assert await client.count_tokens(message) == len(server.render(message).split())
        assert server.tokenized[-1] == server.render(message)
    assert server.paths.count("/apply-template") == 3, "the probe once, then the template each time"
    await client.aclose()


async def test_longer_conversations_and_another_template_go_the_two_step_way() -> None:
    server = LlamaServer()
    client = client_of(server)
    turn = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]
    assert await client.count_tokens(turn) == len(chatml(turn).split())
    assert server.paths == ["/apply-template", "/tokenize"]
    server.paths.clear()
    await client.count_tokens(turn[:2])  # a turn of an older history: no probe of it
    assert server.paths == ["/apply-template", "/tokenize"]
    client.forget_templates()
    server.paths.clear()
    await client.count_tokens([{"role": "user", "content": "again"}])
    assert server.paths == ["/apply-template", "/tokenize"], "the probe is rendered again"
    await client.aclose()


async def test_a_connection_the_server_had_closed_is_asked_again_once() -> None:
    """llama-server closes kept-alive connections: the next request on one fails before any answer. A count is
    safe to repeat, so it is asked once more; a second failure is the engine's ("backend.broken")."""
    server, failures = LlamaServer(), [1]

    def closing(request: httpx.Request) -> httpx.Response:
        if failures:
            failures.pop()
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        return server(request)

    client = client_of(server)
    client.http = httpx.AsyncClient(transport=httpx.MockTransport(closing))
    asked: list[Message] = [{"role": "user", "content": "one two three"}]
    assert await client.count_tokens(asked) == len(chatml(asked).split()), "the count the second asking got"
    assert server.paths == ["/apply-template", "/tokenize"], "the closed connection's request reached no server"
    failures[:] = [1, 1]
    with pytest.raises(BackendError) as broken:  # two failures in a row reach the caller
        await client.count_tokens([{"role": "user", "content": "four five"}])
    assert broken.value.code == "backend.broken"


async def test_no_tokens_for_a_conversation_is_no_count() -> None:
    """llama-server behind a router, asked in vLLM's shape (messages, not content), answers no tokens: the caller
    then estimates rather than take the prompt as empty."""
    client = ChatClient(Endpoint("http://router", "key", "m", Api.VLLM), retries=0)
    client.http = httpx.AsyncClient(transport=httpx.MockTransport(lambda _: httpx.Response(200, json={"tokens": []})))
    assert await client.count_tokens([{"role": "user", "content": "hello"}]) is None
    await client.http.aclose()
    await client.aclose()


@pytest.mark.parametrize("api", list(Api))
async def test_each_dialects_count_over_http_is_the_servers_own(api: Api) -> None:
    """Against the stand-in engine speaking `api` over HTTP (tests/stub_engine.py: a token a word), the count is the
    server's: vLLM's /tokenize of the messages, llama-server's /tokenize of its /apply-template's text; without a
    dialect, /tokenize answers 404 and there is no count (the caller estimates)."""
    conversation: list[Message] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one two"}]
    for dialect, expected in ((api.value, 4), (None, None)):
        async with StubEngine(dialect=dialect) as server:
            client = ChatClient(Endpoint(server.url, "key", "m", api), retries=0)
            try:
                assert await client.count_tokens(conversation) == expected, dialect
                assert await client.count_tokens(conversation[1:]) == (expected and 2), "a message after a head"
            finally:
                await client.aclose()
        assert server.requests == [], "a count is no chat request"
