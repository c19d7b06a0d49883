"""Coalescing streamed pieces: first at once, then at most one page update per interval, nothing lost."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from backend.chat.pacing import paced


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def pieces(clock: Clock, items: list[tuple[float, str]]) -> AsyncIterator[str]:
    for at, text in items:
        clock.now = at
        yield text


async def test_first_piece_immediately_then_coalesced() -> None:
    clock = Clock()
    items = [(0.000, "A"), (0.005, "b"), (0.010, "c"), (0.025, "d"), (0.030, "e"), (0.050, "f")]
    out = [p async for p in paced(pieces(clock, items), 0.02, clock)]
    assert out == ["A", "bcd", "ef"]
    assert "".join(out) == "Abcdef"


async def test_slow_stream_passes_through_and_empty_pieces_are_skipped() -> None:
    clock = Clock()
    items = [(0.0, "a"), (0.1, ""), (0.2, "b"), (0.4, "c")]
    out = [p async for p in paced(pieces(clock, items), 0.02, clock)]
    assert out == ["a", "b", "c"]


async def test_zero_interval_sends_every_piece() -> None:
    clock = Clock()
    items = [(0.0, "a"), (0.0, "b"), (0.0, "c")]
    assert [p async for p in paced(pieces(clock, items), 0.0, clock)] == ["a", "b", "c"]


async def test_text_held_back_is_handed_on_before_a_broken_stream_raises() -> None:
    clock = Clock()

    async def breaking() -> AsyncIterator[str]:
        async for piece in pieces(clock, [(0.000, "A"), (0.005, "b"), (0.010, "c")]):
            yield piece
        raise ConnectionError("the engine went away")

    out: list[str] = []
    with pytest.raises(ConnectionError):
        async for piece in paced(breaking(), 0.02, clock):
            out.append(piece)
    assert out == ["A", "bc"], "the pieces gathered since the last update are not lost"
