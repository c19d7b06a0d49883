"""The line in front of the engine: places, fairness between users, bounds, expected waits, leaving, draining."""

from __future__ import annotations

import asyncio

import pytest

from backend.chat.admission import Admission, Ticket
from backend.errors import ServerFullError, ServerRestartingError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def line(capacity: int = 2, queue_max: int = 10, max_wait_s: float = 600, reply_s: float = 10) -> Admission:
    return Admission(capacity, queue_max, max_wait_s, reply_s, clock=Clock())


def test_requests_run_at_once_while_places_are_free_then_wait_in_line() -> None:
    a = line(capacity=2)
    first, second, third = a.join("ann"), a.join("bob"), a.join("cy")
    assert first.running and second.running and not third.running
    assert (first.place, second.place, third.place) == (0, 0, 1)
    assert third.expected_s == pytest.approx(1 * 10 / 2), "one place frees every reply_s / capacity"
    first.leave()
    assert third.running and third.place == 0, "the next in line runs when a place frees"
    assert len(a.running) == 2


def test_one_users_many_requests_do_not_push_a_colleague_back() -> None:
    a = line(capacity=1, queue_max=20)
    busy = a.join("ann")  # running
    flood = [a.join("ann") for _ in range(10)]  # ann's ten more wait
    bob = a.join("bob")
    assert bob.place == 2, "bob waits behind ann's next one only, not behind all ten"
    assert [t.place for t in flood[:3]] == [1, 3, 4]
    busy.leave()
    assert flood[0].running
    flood[0].leave()
    assert bob.running, "then it is bob's turn"
    order = [t.user for t in a.order()]
    assert order == ["ann"] * 9


def test_turns_go_round_the_users_each_users_oldest_first() -> None:
    a = line(capacity=1)
    a.join("x")
    tickets = [a.join(u) for u in ("ann", "ann", "bob", "cy", "bob")]
    assert [(t.user, t.place) for t in a.order()] == [("ann", 1), ("bob", 2), ("cy", 3), ("ann", 4), ("bob", 5)]
    assert tickets[1].place == 4 and tickets[4].place == 5


def test_a_full_line_refuses_at_once_with_when_to_try_again() -> None:
    a = line(capacity=1, queue_max=3, reply_s=20)
    a.join("a")
    for user in ("b", "c", "d"):
        a.join(user)
    with pytest.raises(ServerFullError) as full:
        a.join("e")
    assert full.value.code == "admission.full" and full.value.params["waiting"] == 3
    assert full.value.retry_after_s >= 1 and a.refused == 1
    # by expected wait: 2 places per 10 s, at most 30 s: the 7th in line would wait 35 s
    b = line(capacity=2, queue_max=100, max_wait_s=30, reply_s=10)
    for i in range(2 + 6):
        b.join(f"u{i}")
    with pytest.raises(ServerFullError) as late:
        b.join("late")
    assert 1 <= late.value.retry_after_s <= 35


def test_leaving_the_line_frees_the_place_and_moves_those_behind_up() -> None:
    a = line(capacity=1)
    a.join("a")
    b, c = a.join("b"), a.join("c")
    b.leave()  # stopped while waiting
    assert c.place == 1 and a.waiting == 1
    b.leave()  # twice: nothing more
    assert a.waiting == 1


def test_the_expected_wait_learns_how_long_replies_hold_their_place() -> None:
    clock = Clock()
    a = Admission(1, 10, 600, 10.0, clock=clock)
    t = a.join("a")
    clock.now += 30
    t.leave()
    assert a.reply_s == pytest.approx(0.8 * 10 + 0.2 * 30)


def test_more_places_let_more_run_at_once() -> None:
    a = line(capacity=1)
    tickets = [a.join(u) for u in "abc"]
    assert [t.running for t in tickets] == [True, False, False]
    a.resize(3)
    assert all(t.running for t in tickets)


async def test_a_waiting_request_is_woken_when_its_turn_comes_and_a_drain_refuses_the_rest() -> None:
    a = line(capacity=1)
    running = a.join("a")
    waiting = a.join("b")
    assert await waiting.wait(0.01) is False
    woke = asyncio.ensure_future(waiting.wait(5))
    await asyncio.sleep(0)
    running.leave()
    assert await woke is True
    later = a.join("c")
    a.close(seconds=45)
    with pytest.raises(ServerRestartingError) as refused:
        await later.wait(1)
    assert refused.value.retry_after_s == 45 and refused.value.code == "admission.restarting"
    with pytest.raises(ServerRestartingError):
        a.join("d")
    assert await a.drained(0.01) is False, "b still runs"
    done = asyncio.ensure_future(a.drained(5))
    await asyncio.sleep(0)
    waiting.leave()
    assert await done is True


def test_tickets_are_told_apart_even_when_alike() -> None:
    a = line(capacity=1)
    one, two = a.join("a"), a.join("a")
    assert isinstance(one, Ticket) and one != two and len({one, two}) == 2


def full_line(capacity: int, reply_s: float = 10) -> tuple[Admission, Clock, list[Ticket]]:
    clock = Clock()
    a = Admission(capacity, 1000, 10**6, reply_s, clock=clock)
    return a, clock, [a.join(f"run{i}") for i in range(capacity)]


def free_one_every(a: Admission, clock: Clock, seconds: float, times: int, user: str = "next") -> None:
    """The oldest running request ends every `seconds`, and a newcomer takes its place (the line stays full)."""
    for i in range(times):
        clock.now += seconds
        min(a.running, key=lambda t: t.started or 0).leave()
        a.join(f"{user}{i}")


def test_the_expected_wait_is_measured_from_how_fast_places_free() -> None:
    a, clock, _ = full_line(capacity=2, reply_s=10)
    assert a.place_s == pytest.approx(5)  # before the line has moved: the engine's reply time / its places
    free_one_every(a, clock, 3, times=6)
    waiting = [a.join(f"w{i}") for i in range(4)]
    assert a.place_s == pytest.approx(3)
    assert [t.expected_s for t in waiting] == pytest.approx([3, 6, 9, 12])


def test_the_expected_wait_follows_replies_that_lengthen() -> None:
    a, clock, _ = full_line(capacity=4, reply_s=4)
    free_one_every(a, clock, 1, times=40)
    free_one_every(a, clock, 4, times=40, user="later")  # chats grow: places now free four times slower
    assert a.place_s == pytest.approx(4)


def test_a_line_that_stops_moving_shows_a_growing_wait() -> None:
    a, clock, _ = full_line(capacity=2)
    free_one_every(a, clock, 2, times=8)
    waiting = a.join("w")
    before = waiting.expected_s
    clock.now += 60  # nothing ends for a minute (a slowed engine)
    assert before == pytest.approx(2) and waiting.expected_s > 6


def test_seconds_with_a_place_free_do_not_slow_the_estimate() -> None:
    a, clock, _ = full_line(capacity=2)
    free_one_every(a, clock, 2, times=8)
    for t in list(a.running):  # everyone is answered; the engine idles for ten minutes
        clock.now += 2
        t.leave()
    clock.now += 600
    a.join("x"), a.join("y")  # full again
    assert a.place_s == pytest.approx(2, rel=0.05)


def test_a_changed_number_of_places_measures_the_line_again() -> None:
    a, clock, _ = full_line(capacity=2, reply_s=10)
    free_one_every(a, clock, 1, times=8)
    a.resize(4)
    assert a.place_s == pytest.approx(a.reply_s / 4)  # the prior again, not the 1 s of two places


def test_in_a_crowd_of_chats_most_expected_waits_are_within_half_the_wait() -> None:
    """A simulated crowd (fake clock): 64 chats asking again 0.5-3 s after each reply, and one API user with four
    requests at once, on 8 places; replies of widely varying length that grow as the chats do. Once the line has
    moved for a minute, the wait each newcomer is told is within half the wait that follows for nine in ten."""
    import heapq
    import random

    rnd, clock = random.Random(7), Clock()
    a = Admission(8, 1000, 10**6, 15.0, clock=clock)
    events: list[tuple[float, int, str, Ticket | None]] = []
    turns: dict[str, int] = {}
    told: dict[Ticket, tuple[float, float]] = {}
    off: list[float] = []
    for i, user in enumerate([f"chat{u}" for u in range(64)] + ["api"] * 4):
        heapq.heappush(events, (clock.now + rnd.uniform(0, 5), i, user, None))

    def started(ticket: Ticket, seq: int) -> None:
        joined, expected = told.pop(ticket)
        if clock.now - joined > 0 and joined > 1060:
            off.append(abs(expected - (clock.now - joined)) / max(clock.now - joined, 1.0))
        hold = rnd.lognormvariate(0, 0.5) * (8 + 1.5 * min(turns.get(ticket.user, 0), 10))
        heapq.heappush(events, (clock.now + hold, seq, ticket.user, ticket))

    seq = 100
    while events and clock.now < 1600:
        clock.now, _, user, ending = heapq.heappop(events)
        seq += 1
        if ending is None:
            ticket = a.join(user)
            told[ticket] = (clock.now, ticket.expected_s)
            if ticket.running:
                started(ticket, seq)
            continue
        turns[user] = turns.get(user, 0) + 1
        before = set(a.running)
        ending.leave()
        for ticket in a.running - before:
            started(ticket, seq)
        heapq.heappush(events, (clock.now + rnd.uniform(0.5, 3), seq, user, None))
    assert len(off) > 200
    assert sum(o <= 0.5 for o in off) / len(off) >= 0.9
