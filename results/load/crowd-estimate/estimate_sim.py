"""The line's expected waits against the waits that follow, in simulated crowds (a fake clock, the app's own
Admission): how many of the waits each newcomer is told are within half the wait that follows, for windows of 8,
16 and 32 places freed (backend/chat/admission.py: WINDOW_PER_PLACE x places). Replies last a lognormal time
(sigma 0.5) around `base + grow x turn` seconds; each chat asks again 0.3-1.5 s after its reply; 8 places.

usage: .venv/bin/python results/load/crowd-estimate/estimate_sim.py   (prints the table of results/load/crowd-estimate)

Crowds: "64 then 16": 64 chats of long replies for 300 s, then 16 fresh chats of short replies for 150 s (as the
committed crowd runs do, one after the other on the same app); "16 steady": 16 chats for 400 s. Four seeds each.
"""

from __future__ import annotations

import heapq
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import backend.chat.admission as admission
from backend.chat.admission import Admission

Phase = tuple[float, float, int, float, float]  # start, end, chats, base s, grow s per turn


def crowd(seed: int, phases: list[Phase], places: int = 8, warm_s: float = 30) -> list[tuple[float, float, float]]:
    """(wait, expected wait, joined) for every newcomer told a measured wait after `warm_s`."""
    rnd, now = random.Random(seed), [0.0]
    line = Admission(places, 1000, 10**9, 15.0, clock=lambda: now[0])
    events: list[tuple[float, int, str, str, object]] = []
    seq = [0]

    def push(t: float, kind: str, user: str, ticket: object = None) -> None:
        seq[0] += 1
        heapq.heappush(events, (t, seq[0], kind, user, ticket))

    turns: dict[str, int] = {}
    told: dict[object, tuple[float, float, bool]] = {}
    ends: dict[str, float] = {}
    shape: dict[str, tuple[float, float]] = {}
    rows: list[tuple[float, float, float]] = []
    for p, (start, end, chats, base, grow) in enumerate(phases):
        for c in range(chats):
            name = f"p{p}c{c}"
            ends[name], shape[name] = end, (base, grow)
            push(start + rnd.uniform(0, 2), "ask", name)

    def started(ticket) -> None:  # type: ignore[no-untyped-def]
        joined, expected, measured = told.pop(ticket)
        if measured and joined > warm_s:
            rows.append((now[0] - joined, expected, joined))
        base, grow = shape[ticket.user]
        hold = rnd.lognormvariate(0, 0.5) * (base + grow * turns.get(ticket.user, 0))
        push(now[0] + hold, "end", ticket.user, ticket)

    while events:
        now[0], _, kind, user, ending = heapq.heappop(events)
        if kind == "ask":
            if now[0] > ends[user]:
                continue
            ticket = line.join(user)
            told[ticket] = (now[0], ticket.expected_s, line.measured)
            if ticket.running:
                started(ticket)
            continue
        turns[user] = turns.get(user, 0) + 1
        before = set(line.running)
        ending.leave()  # type: ignore[attr-defined]
        for ticket in line.running - before:
            started(ticket)
        push(now[0] + rnd.uniform(0.3, 1.5), "ask", user)
    return rows


def within_half(rows: list[tuple[float, float, float]], after: float = 0, before: float = 1e9) -> float:
    off = [abs(expected - wait) / max(wait, 1.0) for wait, expected, joined in rows if after <= joined < before]
    return sum(o <= 0.5 for o in off) / len(off)


def main() -> None:
    print("| window (places freed) | 64 chats | then 16 | 16 steady |")
    print("|---|---|---|---|")
    for window in (8, 16, 32):
        admission.WINDOW_PER_PLACE, admission.MIN_WINDOW = window // 8, window
        big, after, steady = [], [], []
        for seed in range(4):
            rows = crowd(seed, [(0, 300, 64, 8, 1.5), (300, 450, 16, 2, 1.0)])
            big.append(within_half(rows, 0, 300))
            after.append(within_half(rows, 300))
            steady.append(within_half(crowd(seed, [(0, 400, 16, 3, 1.0)])))
        cells = [f"{statistics.mean(x):.2f} ({min(x):.2f}-{max(x):.2f})" for x in (big, after, steady)]
        print(f"| {window} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
