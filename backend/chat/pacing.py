"""Coalescing streamed text so the browser keeps up.

One page update per token costs ~7 ms in the browser: at a few hundred tokens/s the page falls behind
and, with several users, replies are lost. Sending the text gathered over ~20 ms per update keeps up
(figures in ../shared/ENVIRONMENT.md). The first piece goes out at once so time to first token is kept.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterable, Callable


async def paced(
    pieces: AsyncIterable[str],
    interval_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncGenerator[str, None]:
    """Yield the first piece at once, then the text gathered since the last yield at most every interval_s."""
    pending: list[str] = []
    last: float | None = None
    source = aiter(pieces)
    try:
        async for piece in source:
            if not piece:
                continue
            now = clock()
            if last is None or now - last >= interval_s:
                pending.append(piece)
                yield "".join(pending)
                pending.clear()
                last = now
            else:
                pending.append(piece)
    except (Exception, asyncio.CancelledError):
        # A broken stream or a stop: the text held back arrived all the same; hand it on, then the error.
        if pending:
            yield "".join(pending)
        raise
    finally:
        if isinstance(source, AsyncGenerator):  # closed in this task, not later by the garbage collector
            await source.aclose()
    if pending:
        yield "".join(pending)
