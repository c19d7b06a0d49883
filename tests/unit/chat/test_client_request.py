"""What the streaming client sends: the chat request's JSON body, as a local HTTP server receives it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from backend.chat.client import ChatClient
from backend.engines.base import Endpoint

GENEROUS_S = 20.0  # a safety net against a hanging test, never a synchronisation
MESSAGES = [{"role": "user", "content": "hi"}]
# One short reply that ends properly: a piece, the finish, usage, [DONE] (each event one HTTP chunk).
EVENTS = [
    {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}},
    "[DONE]",
]


class BodyServer:
    """An HTTP server on a port the OS picks that keeps the JSON body of each chat request and answers EVENTS."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> BodyServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        length = next(int(h.split(":", 1)[1]) for h in head.split("\r\n") if h.lower().startswith("content-length"))
        self.bodies.append(json.loads(await reader.readexactly(length)))
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n"
        )
        for event in EVENTS:
            data = f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n".encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()


async def sent(**sampling: Any) -> dict[str, Any]:
    """The body the client sends for one reply with `sampling`."""
    async with BodyServer() as server:
        client = ChatClient(Endpoint(f"http://127.0.0.1:{server.port}", "k", "m"), connect_timeout_s=2.0)
        try:
            async with client.stream(MESSAGES, **sampling) as s:
                pieces = await asyncio.wait_for(_all(s), GENEROUS_S)
        finally:
            await client.aclose()
    assert pieces == ["ok"] and s.stats.finish_reason == "stop"
    [body] = server.bodies
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
