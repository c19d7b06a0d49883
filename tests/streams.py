"""Giving up a streamed reply at its first piece, the two ways the chat does: leaving the stream (the reply's
page goes), and cancelling the task that reads it (the stop button)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from backend.chat.client import ChatClient, Message
from tests.deadlines import ENGINE_S


async def leave_at_first_piece(client: ChatClient, messages: list[Message], **sampling: Any) -> None:
    async with client.stream(messages, **sampling) as s:
        async for _ in s:
            break


async def cancel_at_first_piece(client: ChatClient, messages: list[Message], **sampling: Any) -> None:
    seen = asyncio.Event()

    async def consume() -> None:
        async with client.stream(messages, **sampling) as s:
            async for _ in s:
                seen.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(seen.wait(), ENGINE_S)  # ends at the first piece
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
