"""The chat's quota: a login user's chat turn takes a place within their quotas before it runs (shared with their API
requests and workshop tries; the store is backend.storage.quotas), and its tokens are counted against them as it ends.
Over a quota the turn is refused with why and until when. Without login, or while the database fails, the chat goes
on unlimited."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal, Protocol

from backend.chat.turn import Done, Event, Refused, Started
from backend.errors import QuotaError, StorageError

log = logging.getLogger(__name__)

Route = Literal["chat", "api"]
# route ("chat" or "api"), outcome (ok, stopped, error, refused, over_quota...), prompt tokens, reply tokens
Observer = Callable[[str, str, int, int], None]


@dataclass
class Lease:
    """One admitted request: release it with the tokens it used (Quotas.hold does)."""

    id: str
    user: str
    route: Route
    prompt_tokens: int = 0
    reply_tokens: int = 0
    at: float = 0.0  # when it was admitted (its row in the minute's requests)
    asked: bool = True  # the engine was asked for a reply; else the request is taken back, not counted (withdraw)

    def record(self, prompt_tokens: int | None, reply_tokens: int | None) -> None:
        self.prompt_tokens, self.reply_tokens = int(prompt_tokens or 0), int(reply_tokens or 0)


class QuotaStore(Protocol):
    """Where the places are taken and the usage counted (backend.storage.quotas.Quotas)."""

    async def admit(self, user: str, route: Route) -> Lease: ...

    async def release_soon(self, lease: Lease, counted: bool = True) -> None: ...


def _no_observer(route: str, outcome: str, prompt: int, reply: int) -> None:
    return None


class ChatQuota:
    """The quota places of chat turns (and workshop tries) in `store` (None: no quotas, without login or database)."""

    def __init__(self, store: QuotaStore | None = None, observe: Observer = _no_observer) -> None:
        self.store = store
        self.observe = observe  # where a turn refused over a quota is counted (a turn that ran: ChatService.reply)

    @asynccontextmanager
    async def place(self, user: str | None, route: Route = "chat") -> AsyncIterator[Lease | None]:
        """A quota place for one chat turn of `user` (none without login, or while the database fails: the chat
        goes on); QuotaError when the user is over a quota. The tokens recorded on the lease count as it ends; a
        lease not `asked` when it ends is taken back, uncounted."""
        lease: Lease | None = None
        if self.store is not None and user is not None:
            try:
                lease = await self.store.admit(user, route)
            except StorageError as exc:
                log.error("Quotas not checked for a chat turn: %s", exc)
        try:
            yield lease
        finally:
            if lease is not None and self.store is not None:
                await self.store.release_soon(lease, counted=lease.asked)

    async def turn(self, user: str | None, events: AsyncIterator[Event]) -> AsyncGenerator[Event, None]:
        """A chat turn's events within the user's quota, its tokens counted against it as it ends; over a quota,
        Refused with why and until when. A message refused before its reply was asked for is not counted."""
        try:
            async with self.place(user) as lease:
                if lease is not None:
                    lease.asked = False
                async for event in events:
                    if lease is not None and isinstance(event, Started):
                        lease.asked = True
                    if lease is not None and isinstance(event, Done):
                        lease.record(*event.counted)
                    yield event
        except QuotaError as exc:
            self.observe("chat", "over_quota", 0, 0)
            yield Refused(exc)
