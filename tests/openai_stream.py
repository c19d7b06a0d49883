"""What every stand-in engine of the tests says: an OpenAI-compatible chat stream, in one place.

tests/stub_engine.py (a child process), tests/app_process.FakeEngine (a thread) and tests/unit/chat/
test_client_retry.ScriptedServer (scripted sockets) all stream a reply with these: its pieces, the finish, the
usage, [DONE]. Standard library only: tests/stub_engine.py imports it as a script's neighbour."""

from __future__ import annotations

import json
from typing import Any

DONE = "[DONE]"


def chunk(model: str, choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> dict[str, Any]:
    """One chat.completion.chunk."""
    data: dict[str, Any] = {"id": "stub", "object": "chat.completion.chunk", "created": 0, "model": model}
    data["choices"] = choices
    if usage is not None:
        data["usage"] = usage
    return data


def piece(model: str, text: str) -> dict[str, Any]:
    """A chunk of the reply's text."""
    return chunk(model, [{"index": 0, "delta": {"content": text}, "finish_reason": None}])


def finish(model: str, reason: str = "stop") -> dict[str, Any]:
    """The chunk that says why the reply ended."""
    return chunk(model, [{"index": 0, "delta": {}, "finish_reason": reason}])


def usage(model: str, prompt: int, completion: int) -> dict[str, Any]:
    """The last chunk: the request's token counts (stream_options.include_usage)."""
    return chunk(
        model, [], {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    )


def words(reply: str) -> list[str]:
    """The reply's pieces: word by word, each but the last with its space."""
    parts = reply.split(" ")
    return [word if i == len(parts) - 1 else word + " " for i, word in enumerate(parts)]


def event(data: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


def http_chunk(data: bytes) -> bytes:
    """`data` as one chunk of a chunked HTTP body (b"" ends the body)."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def reply_events(model: str, reply: str, prompt_tokens: int = 1) -> list[bytes]:
    """A whole streamed reply as its events: the pieces, the finish, the usage, [DONE]."""
    pieces = words(reply)
    chunks = [piece(model, text) for text in pieces] + [finish(model), usage(model, prompt_tokens, len(pieces))]
    return [event(c) for c in chunks] + [event(DONE)]
