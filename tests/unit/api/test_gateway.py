"""The chat's quota place (Gateway.turn): none without a user, over a quota the QuotaError, and a failing database
does not stop the chat."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

from backend.api.quotas import Lease
from backend.api.router import Gateway
from backend.chat.client import StreamStats
from backend.chat.turn import Done, Event, Refused, Started, Text
from backend.errors import InvalidInputError, QuotaError, StorageError
from backend.prompts.schema import Reason


class FakeQuotas:
    def __init__(self, refusal: Exception | None = None) -> None:
        self.refusal, self.released, self.counted = refusal, [], []  # type: ignore[var-annotated]

    async def admit(self, user: str, route: str) -> Lease:
        if self.refusal is not None:
            raise self.refusal
        return Lease("1", user, route)  # type: ignore[arg-type]

    async def release_soon(self, lease: Lease, counted: bool = True) -> None:
        self.released.append(lease)
        self.counted.append(counted)


def gateway(quotas: FakeQuotas | None) -> Gateway:
    return Gateway(SimpleNamespace(), SimpleNamespace(), None, quotas)  # type: ignore[arg-type]


async def test_a_turn_holds_a_place_and_gives_it_back() -> None:
    quotas = FakeQuotas()
    async with gateway(quotas).turn("alice") as lease:
        assert lease is not None and lease.user == "alice" and not quotas.released
    assert quotas.released == [lease]
    async with gateway(quotas).turn(None) as nobody:  # no login: no user, no quota
        assert nobody is None


async def test_over_a_quota_the_turn_is_refused_and_a_broken_database_lets_it_go_on() -> None:
    with pytest.raises(QuotaError):
        async with gateway(FakeQuotas(QuotaError.of("quota.rate", limit=1, retry_s=3))).turn("alice"):
            pytest.fail("the turn ran")
    broken = FakeQuotas(StorageError.of("storage.locked", where="x", doing="saving", reason="locked"))
    async with gateway(broken).turn("alice") as lease:
        assert lease is None


def test_a_finished_turn_counts_the_engines_tokens_or_the_requests_estimate() -> None:
    seen: list[tuple[str, str, int, int]] = []
    gate = Gateway(SimpleNamespace(), SimpleNamespace(), None, None, observe=lambda *a: seen.append(a))  # type: ignore[arg-type]
    lease = Lease("1", "alice", "chat")  # type: ignore[arg-type]
    measured = StreamStats(prompt_tokens=12, completion_tokens=30)
    done = Done("x", "default", Reason("default"), "q", stats=measured, prompt_tokens=99)
    assert gate.count_turn(lease, done) is done
    assert (lease.prompt_tokens, lease.reply_tokens) == (12, 30)
    stopped = Done("", "default", Reason("default"), "q", "stopped", stats=StreamStats(), prompt_tokens=7)
    gate.count_turn(None, stopped)  # no usage reported: the request's own count
    gate.count_turn(lease, Text("a piece"))  # not a finished turn: nothing counted
    assert seen == [("chat", "finished", 12, 30), ("chat", "stopped", 7, 0)]


async def test_a_chat_message_refused_before_its_reply_was_asked_for_is_not_counted() -> None:
    """Refused before the engine was asked (empty, too long, an unknown template, no room): its place and its count in
    the minute are taken back (Quotas.withdraw); a reply that was asked for counts, whatever its end."""
    refused = [Refused(InvalidInputError.of("input.empty"))]
    asked = [Started("q"), Done("x", "default", Reason("default"), "q", stats=StreamStats(), prompt_tokens=3)]
    for events, counted in ((refused, False), (asked, True)):
        quotas = FakeQuotas()

        async def turn(events: list[Event] = events) -> AsyncIterator[Event]:
            for event in events:
                yield event

        assert [e async for e in gateway(quotas).chat_turn("alice", turn())] == events
        assert quotas.counted == [counted]
