"""The chat's quota place (backend.chat.quota): none without a user, over a quota the QuotaError (Refused, counted as
over_quota), a failing database does not stop the chat, and a finished turn's tokens count against the user's quota."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from backend.chat.client import StreamStats
from backend.chat.quota import ChatQuota, Lease
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


async def events_of(events: list[Event]) -> AsyncIterator[Event]:
    for event in events:
        yield event


async def test_a_turn_holds_a_place_and_gives_it_back() -> None:
    quotas = FakeQuotas()
    async with ChatQuota(quotas).place("alice") as lease:
        assert lease is not None and lease.user == "alice" and not quotas.released
    assert quotas.released == [lease]
    async with ChatQuota(quotas).place(None) as nobody:  # no login: no user, no quota
        assert nobody is None
    async with ChatQuota(None).place("alice") as unlimited:  # no database: no quotas
        assert unlimited is None


async def test_over_a_quota_the_turn_is_refused_and_a_broken_database_lets_it_go_on() -> None:
    with pytest.raises(QuotaError):
        async with ChatQuota(FakeQuotas(QuotaError.of("quota.rate", limit=1, retry_s=3))).place("alice"):
            pytest.fail("the turn ran")
    broken = FakeQuotas(StorageError.of("storage.locked", where="x", doing="saving", reason="locked"))
    async with ChatQuota(broken).place("alice") as lease:
        assert lease is None


async def test_a_turn_over_a_quota_is_refused_and_counted_once_as_over_quota() -> None:
    seen: list[tuple[str, str, int, int]] = []
    quota = ChatQuota(FakeQuotas(QuotaError.of("quota.rate", limit=1, retry_s=3)), lambda *a: seen.append(a))
    asked = [Started("q"), Done("x", "default", Reason("default"), "q", stats=StreamStats(), prompt_tokens=3)]
    events = [e async for e in quota.turn("alice", events_of(asked))]
    assert len(events) == 1 and isinstance(events[0], Refused) and events[0].error.code == "quota.rate"
    assert seen == [("chat", "over_quota", 0, 0)]


async def test_a_finished_turn_counts_the_engines_tokens_or_the_requests_estimate() -> None:
    seen: list[tuple[str, str, int, int]] = []
    measured = Done("x", "default", Reason("default"), "q", stats=StreamStats(prompt_tokens=12, completion_tokens=30),
                    prompt_tokens=99)  # fmt: skip
    unmeasured = Done("", "default", Reason("default"), "q", "stopped", stats=StreamStats(), prompt_tokens=7)
    for done, counted in ((measured, (12, 30)), (unmeasured, (7, 0))):
        quotas = FakeQuotas()
        quota = ChatQuota(quotas, lambda *a: seen.append(a))
        events = [Started("q"), Text("a piece"), done]
        assert [e async for e in quota.turn("alice", events_of(events))] == events
        (lease,) = quotas.released
        assert (lease.prompt_tokens, lease.reply_tokens) == counted
    assert seen == [], "a turn that ran is counted in the metrics by the service that ran it (ChatService.reply)"


async def test_a_reply_stopped_before_the_engines_usage_counts_its_streamed_chunks_as_the_api_does() -> None:
    """A stop closes the stream before the engine's usage arrives: the reply's tokens are its streamed chunks (as an
    API request's, backend.api.router.tokens_used), not nothing; its details still show no reply count."""
    stopped = Done("one two three", "default", Reason("default"), "q", "stopped", stats=StreamStats(chunks=5),
                   prompt_tokens=7)  # fmt: skip
    quotas = FakeQuotas()
    assert [e async for e in ChatQuota(quotas).turn("alice", events_of([Started("q"), stopped]))][-1] is stopped
    (lease,) = quotas.released
    assert (lease.prompt_tokens, lease.reply_tokens) == (7, 5)
    assert stopped.usage == (7, None)


async def test_a_chat_message_refused_before_its_reply_was_asked_for_is_not_counted() -> None:
    """Refused before the engine was asked (empty, too long, an unknown template, no room): its place and its count in
    the minute are taken back (Quotas.withdraw); a reply that was asked for counts, whatever its end."""
    refused = [Refused(InvalidInputError.of("input.empty"))]
    asked = [Started("q"), Done("x", "default", Reason("default"), "q", stats=StreamStats(), prompt_tokens=3)]
    for events, counted in ((refused, False), (asked, True)):
        quotas = FakeQuotas()
        assert [e async for e in ChatQuota(quotas).turn("alice", events_of(events))] == events
        assert quotas.counted == [counted]
