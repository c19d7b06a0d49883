"""The streaming client against a scripted local HTTP server: retries only before the first token, the read
timeout, and a cancelled reply that closes its HTTP connection (the engine then aborts the request)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import AsyncIterator, Iterator

import pytest

from backend.chat.client import ChatClient, ChatStream
from backend.engines.base import Endpoint
from backend.errors import BackendError, PromptTooLongError
from tests.deadlines import HANG_S
from tests.stub_engine import Behaviour, StubEngine, reset, silent, status, stream

MESSAGES = [{"role": "user", "content": "hi there you"}]


def scripted(*script: Behaviour) -> StubEngine:
    """The stand-in engine answering the n-th request with script[n] (the last one repeats), counting prompts."""
    return StubEngine(*script, count_prompt=True)


def endpoint(server: StubEngine) -> Endpoint:
    return Endpoint(server.url, "k", "m")


async def disconnected(server: StubEngine) -> None:
    """Until the server saw the client it was waiting on go away."""
    assert await asyncio.to_thread(server.disconnected.wait, HANG_S), "the client never went away"


@contextlib.asynccontextmanager
async def client_for(server: StubEngine, retries: int = 2, read_timeout_s: float = 10.0) -> AsyncIterator[ChatClient]:
    client = ChatClient(endpoint(server), connect_timeout_s=2.0, read_timeout_s=read_timeout_s, retries=retries)
    try:
        yield client
    finally:
        await client.aclose()


async def collect(stream: ChatStream, into: list[str] | None = None) -> list[str]:
    pieces = [] if into is None else into
    async with stream:
        async for text in stream:
            pieces.append(text)
    return pieces


async def read_all(client: ChatClient, into: list[str] | None = None) -> tuple[list[str], ChatStream]:
    s = client.stream(MESSAGES, max_tokens=8)
    return await asyncio.wait_for(collect(s, into), HANG_S), s


# ----- (a) failures before the first token are retried -----------------------------------------------------
@pytest.mark.parametrize("failure", [status(503), reset], ids=["503", "connection-reset"])
async def test_failures_before_the_first_token_are_retried_up_to_retries(failure: Behaviour) -> None:
    async with scripted(failure, failure, stream("Hel", "lo")) as server, client_for(server, retries=2) as client:
        pieces, s = await read_all(client)
    assert "".join(pieces) == "Hello"
    assert len(server.requests) == 3, "two failures, then the third attempt answers"
    assert s.stats.attempts == 3 and s.stats.finish_reason == "stop"
    assert (s.stats.prompt_tokens, s.stats.completion_tokens) == (3, 2)


@pytest.mark.parametrize("end", ["break", "hang", "no_finish", "closed"])
async def test_a_stream_that_fails_after_its_headers_but_before_any_text_is_retried(end: str) -> None:
    async with scripted(stream(end=end), stream("Hi")) as server:
        async with client_for(server, retries=1, read_timeout_s=0.3) as client:
            pieces, s = await read_all(client)
    assert pieces == ["Hi"] and len(server.requests) == 2 and s.stats.attempts == 2


@pytest.mark.parametrize(
    ("failure", "code"), [(status(503), "backend.status"), (reset, "backend.broken")], ids=["503", "connection-reset"]
)
async def test_retries_stop_after_retries_and_the_last_failure_is_reported(failure: Behaviour, code: str) -> None:
    async with scripted(failure) as server, client_for(server, retries=1) as client:
        with pytest.raises(BackendError) as caught:
            await read_all(client)
    assert caught.value.code == code
    assert len(server.requests) == 2, "one try and one retry, no more (the openai library's own retries are off)"


async def test_a_refused_request_is_not_retried() -> None:
    too_long = status(400, "This model's maximum context length is 1024 tokens")
    async with scripted(too_long) as server, client_for(server, retries=2) as client:
        with pytest.raises(PromptTooLongError) as caught:
            await read_all(client)
    assert caught.value.code == "context.window_exceeded"
    assert len(server.requests) == 1


# ----- (b) after the first token nothing is retried --------------------------------------------------------
@pytest.mark.parametrize("end", ["break", "no_finish", "closed"])
async def test_a_stream_that_breaks_after_the_first_token_is_not_retried(end: str) -> None:
    pieces: list[str] = []
    async with scripted(stream("Hel", "lo", end=end), stream("never", "seen")) as server:
        async with client_for(server, retries=2) as client:
            with pytest.raises(BackendError) as caught:
                await read_all(client, pieces)
    assert caught.value.code == "backend.broken"
    assert len(server.requests) == 1, "part of the reply reached the user: a retry would repeat it"
    assert "".join(pieces) == "Hello", "what arrived before the break was delivered"


@pytest.mark.parametrize("failure", [reset, stream("Hel", end="break")], ids=["before-any-text", "mid-reply"])
async def test_a_broken_external_server_is_not_said_to_restart(failure: Behaviour) -> None:
    """An external server (vLLM's router, another host) is not the app's to restart: the message says whose it is."""
    async with scripted(failure) as server:
        client = ChatClient(dataclasses.replace(endpoint(server), external=True), connect_timeout_s=2.0, retries=0)
        try:
            with pytest.raises(BackendError) as caught:
                await read_all(client)
        finally:
            await client.aclose()
    assert caught.value.code == "backend.broken_external"
    base_url = endpoint(server).base_url
    english, chinese = caught.value.text("en-US"), caught.value.text("zh-CN")
    assert base_url in english and "does not run it" in english and "restart" not in english
    assert base_url in chinese and "不由本应用运行" in chinese and "重启" not in chinese


# ----- (c) the read timeout -------------------------------------------------------------------------------
async def test_a_server_that_never_answers_times_out() -> None:
    async with scripted(silent) as server, client_for(server, retries=0, read_timeout_s=0.3) as client:
        with pytest.raises(BackendError) as caught:
            await read_all(client)
    assert caught.value.code == "backend.timeout"
    assert len(server.requests) == 1


async def test_a_stream_that_stalls_after_the_first_token_times_out_without_a_retry() -> None:
    pieces: list[str] = []
    async with scripted(stream("Hel", end="hang")) as server:
        async with client_for(server, retries=2, read_timeout_s=0.3) as client:
            with pytest.raises(BackendError) as caught:
                await read_all(client, pieces)
    assert caught.value.code == "backend.timeout"
    assert pieces == ["Hel"] and len(server.requests) == 1


@contextlib.contextmanager
def unanswered_listener() -> Iterator[Endpoint]:
    """A port whose accept queue is full: the kernel drops further connection attempts, so connecting hangs."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    queued = []
    for _ in range(4):  # fill the accept queue (Linux keeps backlog + 1 connections waiting)
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        queued.append(s)
    try:
        yield Endpoint(base_url=f"http://127.0.0.1:{port}", api_key="k", model="m")
    finally:
        for s in [*queued, server]:
            s.close()


async def test_a_server_that_never_accepts_the_connection_times_out_at_the_connect_timeout() -> None:
    """Without the connect timeout the attempt would hang well past HANG_S (the read timeout is longer)."""
    with unanswered_listener() as endpoint:
        client = ChatClient(endpoint, connect_timeout_s=0.3, read_timeout_s=3600.0, retries=1)
        try:
            with pytest.raises(BackendError) as caught:
                await asyncio.wait_for(collect(client.stream(MESSAGES, max_tokens=8)), HANG_S)
        finally:
            await client.aclose()
    assert caught.value.code == "backend.timeout"


# ----- (d) cancelling the reply closes the connection -----------------------------------------------------
@pytest.mark.parametrize("where", ["reading", "elsewhere"])
async def test_cancelling_the_reply_closes_the_connection(where: str) -> None:
    """Cancelled while waiting for the next chunk, or while busy with the first (the stop button pressed while
    the page is updated): either way the server sees the client go away while the client itself stays open."""
    first = asyncio.Event()

    async def consume(client: ChatClient) -> None:
        s = client.stream(MESSAGES)
        async with s:
            async for _ in s:
                first.set()
                if where == "elsewhere":
                    await asyncio.Event().wait()  # cancelled here, outside the stream

    async with scripted(stream("Hel", end="hang")) as server, client_for(server) as client:
        task = asyncio.create_task(consume(client))
        await asyncio.wait_for(first.wait(), HANG_S)
        assert not server.disconnected.is_set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await disconnected(server)
    assert len(server.requests) == 1
