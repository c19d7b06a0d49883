"""A stream read by the API closes whole when its reader is cancelled the way Starlette cancels a response whose
client went away (an anyio cancel scope, which cancels every later await too)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import anyio

from backend.api.serving import detached


class SlowClose:
    """A stream whose close takes a few awaits (as closing the HTTP response to the engine does)."""

    def __init__(self) -> None:
        self.closed = False

    async def __aenter__(self) -> SlowClose:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.sleep(0.01)
        await asyncio.sleep(0.01)
        self.closed = True

    async def __aiter__(self) -> AsyncIterator[str]:
        yield "a"
        await asyncio.sleep(30)
        yield "b"


async def test_a_cancelled_reader_still_closes_the_stream() -> None:
    stream = SlowClose()
    seen = []
    with anyio.move_on_after(0.2):
        async for piece in detached(stream):  # type: ignore[arg-type]
            seen.append(piece)
    assert seen == ["a"]
    for _ in range(50):
        if stream.closed:
            break
        await asyncio.sleep(0.02)
    assert stream.closed, "the engine's request was closed"


async def test_errors_reach_the_reader() -> None:
    class Failing(SlowClose):
        async def __aiter__(self) -> AsyncIterator[str]:
            yield "a"
            raise ValueError("broken")

    seen = []
    try:
        async for piece in detached(Failing()):  # type: ignore[arg-type]
            seen.append(piece)
    except ValueError as exc:
        assert str(exc) == "broken"
    else:
        raise AssertionError("the error was lost")
    assert seen == ["a"]
