"""The streaming client against a scripted local HTTP server: retries only before the first token, the read
timeout, and a cancelled reply that closes its HTTP connection (the engine then aborts the request)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeAlias

import pytest

from backend.chat.client import ChatClient, ChatStream
from backend.engines.base import Endpoint
from backend.errors import BackendError, PromptTooLongError
from tests.deadlines import HANG_S
from tests.openai_stream import event, http_chunk, usage
from tests.openai_stream import finish as stream_finish
from tests.openai_stream import piece as stream_piece

MESSAGES = [{"role": "user", "content": "hi"}]

Reader: TypeAlias = asyncio.StreamReader
Writer: TypeAlias = asyncio.StreamWriter
Behaviour = Callable[["ScriptedServer", Reader, Writer], Awaitable[None]]


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event as one HTTP chunk."""
    return http_chunk(event(data))


def piece(text: str) -> dict[str, Any]:
    return stream_piece("m", text)


def finish() -> dict[str, Any]:
    return stream_finish("m")


USAGE = usage("m", 3, 2)

STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
)


# ----- what the server does with one request ---------------------------------------------------------------
def status(code: int, message: str = "overloaded") -> Behaviour:
    async def answer(server: ScriptedServer, reader: Reader, writer: Writer) -> None:
        body = json.dumps({"error": {"message": message, "type": "error", "code": code}}).encode()
        head = f"HTTP/1.1 {code} Whatever\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        writer.write(head.encode() + b"Connection: close\r\n\r\n" + body)
        await writer.drain()

    return answer


async def reset(server: ScriptedServer, reader: Reader, writer: Writer) -> None:
    """Drop the connection with a TCP reset before answering (an engine that died under the request)."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def stream(*pieces: str, end: str = "done") -> Behaviour:
    """Stream `pieces`; then end properly ("done"), end the body without a finish_reason ("no_finish"), end the body
    with neither a finish_reason nor [DONE] ("closed": a router whose engine died), close the connection in the
    middle of the chunked body ("break"), or wait until the client goes away ("hang")."""

    async def answer(server: ScriptedServer, reader: Reader, writer: Writer) -> None:
        writer.write(STREAM_HEAD)
        for text in pieces:
            writer.write(sse(piece(text)))
            await writer.drain()
        if end == "done":
            writer.write(sse(finish()) + sse(USAGE) + sse("[DONE]") + b"0\r\n\r\n")
        elif end == "no_finish":
            writer.write(sse("[DONE]") + b"0\r\n\r\n")
        elif end == "closed":
            writer.write(b"0\r\n\r\n")
        elif end == "hang":
            await server.until_client_leaves(reader, writer)
        await writer.drain()

    return answer


async def silent(server: ScriptedServer, reader: Reader, writer: Writer) -> None:
    """Accept the request and never answer."""
    await server.until_client_leaves(reader, writer)


class ScriptedServer:
    """An HTTP/1.1 server on a port the OS picks: the n-th chat request gets script[n] (the last one repeats).

    `requests` counts the chat requests it saw (or completions), `bodies` keeps their JSON bodies and `paths` their
    paths; `disconnected` is set when a
    client it was waiting on went away."""

    def __init__(self, *script: Behaviour) -> None:
        self.script = script
        self.requests = 0
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []  # each request's path (a chat completion, or a completion of token ids)
        self.disconnected = asyncio.Event()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> ScriptedServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        for task in list(self._handlers):
            with contextlib.suppress(BaseException):
                await task
        await self._server.wait_closed()

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(f"http://127.0.0.1:{self.port}", "k", "m")

    async def until_client_leaves(self, reader: Reader, writer: Writer) -> None:
        """Wait (forever if need be) until the client closes its end of the connection."""
        try:
            while await reader.read(1024):
                pass
        except ConnectionError:
            pass
        self.disconnected.set()

    async def _handle(self, reader: Reader, writer: Writer) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            length = next(
                (
                    int(line.split(":", 1)[1])
                    for line in head.split("\r\n")
                    if line.lower().startswith("content-length")
                ),
                0,
            )
            body = await reader.readexactly(length)
            if not head.startswith(("POST /v1/chat/completions ", "POST /v1/completions ")):
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                await writer.drain()
                return
            self.bodies.append(json.loads(body))
            self.paths.append(head.split(" ", 2)[1])
            behaviour = self.script[min(self.requests, len(self.script) - 1)]
            self.requests += 1
            await behaviour(self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.disconnected.set()
        finally:
            with contextlib.suppress(Exception):
                writer.close()
            self._handlers.discard(task)


@contextlib.asynccontextmanager
async def client_for(
    server: ScriptedServer, retries: int = 2, read_timeout_s: float = 10.0
) -> AsyncIterator[ChatClient]:
    client = ChatClient(server.endpoint, connect_timeout_s=2.0, read_timeout_s=read_timeout_s, retries=retries)
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
    async with ScriptedServer(failure, failure, stream("Hel", "lo")) as server, client_for(server, retries=2) as client:
        pieces, s = await read_all(client)
    assert "".join(pieces) == "Hello"
    assert server.requests == 3, "two failures, then the third attempt answers"
    assert s.stats.attempts == 3 and s.stats.finish_reason == "stop"
    assert (s.stats.prompt_tokens, s.stats.completion_tokens) == (3, 2)


@pytest.mark.parametrize("end", ["break", "hang", "no_finish", "closed"])
async def test_a_stream_that_fails_after_its_headers_but_before_any_text_is_retried(end: str) -> None:
    async with ScriptedServer(stream(end=end), stream("Hi")) as server:
        async with client_for(server, retries=1, read_timeout_s=0.3) as client:
            pieces, s = await read_all(client)
    assert pieces == ["Hi"] and server.requests == 2 and s.stats.attempts == 2


@pytest.mark.parametrize(
    ("failure", "code"), [(status(503), "backend.status"), (reset, "backend.broken")], ids=["503", "connection-reset"]
)
async def test_retries_stop_after_retries_and_the_last_failure_is_reported(failure: Behaviour, code: str) -> None:
    async with ScriptedServer(failure) as server, client_for(server, retries=1) as client:
        with pytest.raises(BackendError) as caught:
            await read_all(client)
    assert caught.value.code == code
    assert server.requests == 2, "one try and one retry, no more (the openai library's own retries are off)"


async def test_a_refused_request_is_not_retried() -> None:
    too_long = status(400, "This model's maximum context length is 1024 tokens")
    async with ScriptedServer(too_long) as server, client_for(server, retries=2) as client:
        with pytest.raises(PromptTooLongError) as caught:
            await read_all(client)
    assert caught.value.code == "context.window_exceeded"
    assert server.requests == 1


# ----- (b) after the first token nothing is retried --------------------------------------------------------
@pytest.mark.parametrize("end", ["break", "no_finish", "closed"])
async def test_a_stream_that_breaks_after_the_first_token_is_not_retried(end: str) -> None:
    pieces: list[str] = []
    async with ScriptedServer(stream("Hel", "lo", end=end), stream("never", "seen")) as server:
        async with client_for(server, retries=2) as client:
            with pytest.raises(BackendError) as caught:
                await read_all(client, pieces)
    assert caught.value.code == "backend.broken"
    assert server.requests == 1, "part of the reply reached the user: a retry would repeat it"
    assert "".join(pieces) == "Hello", "what arrived before the break was delivered"


@pytest.mark.parametrize("failure", [reset, stream("Hel", end="break")], ids=["before-any-text", "mid-reply"])
async def test_a_broken_external_server_is_not_said_to_restart(failure: Behaviour) -> None:
    """An external server (vLLM's router, another host) is not the app's to restart: the message says whose it is."""
    async with ScriptedServer(failure) as server:
        client = ChatClient(dataclasses.replace(server.endpoint, external=True), connect_timeout_s=2.0, retries=0)
        try:
            with pytest.raises(BackendError) as caught:
                await read_all(client)
        finally:
            await client.aclose()
    assert caught.value.code == "backend.broken_external"
    base_url = server.endpoint.base_url
    english, chinese = caught.value.text("en-US"), caught.value.text("zh-CN")
    assert base_url in english and "does not run it" in english and "restart" not in english
    assert base_url in chinese and "不由本应用运行" in chinese and "重启" not in chinese


# ----- (c) the read timeout -------------------------------------------------------------------------------
async def test_a_server_that_never_answers_times_out() -> None:
    async with ScriptedServer(silent) as server, client_for(server, retries=0, read_timeout_s=0.3) as client:
        with pytest.raises(BackendError) as caught:
            await read_all(client)
    assert caught.value.code == "backend.timeout"
    assert server.requests == 1


async def test_a_stream_that_stalls_after_the_first_token_times_out_without_a_retry() -> None:
    pieces: list[str] = []
    async with ScriptedServer(stream("Hel", end="hang")) as server:
        async with client_for(server, retries=2, read_timeout_s=0.3) as client:
            with pytest.raises(BackendError) as caught:
                await read_all(client, pieces)
    assert caught.value.code == "backend.timeout"
    assert pieces == ["Hel"] and server.requests == 1


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

    async with ScriptedServer(stream("Hel", end="hang")) as server, client_for(server) as client:
        task = asyncio.create_task(consume(client))
        await asyncio.wait_for(first.wait(), HANG_S)
        assert not server.disconnected.is_set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(server.disconnected.wait(), HANG_S)
    assert server.requests == 1
