"""What a benchmark measures and in which order: rounds alternated, and how many requests each level gets.

A round runs every dataset at every level once, and at the levels chosen for the app's client both targets
one after the other (server, app). The rounds follow each other, so each configuration is measured
A B A B ..., never all rounds of one before the next: a machine that slows down or warms up during the run
moves every configuration alike and shows up as spread, not as a difference between them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

MIN_REQUESTS = 32  # per level and round: P50 and P90 rest on more than a handful of requests, even at one user
TARGETS = ("server", "app")  # plain HTTP to the engine; the app's own client path


@dataclass(frozen=True)
class Measurement:
    """One level of one dataset against one target, in one round (counted from 1)."""

    round: int
    dataset: str
    level: int
    target: str


def schedule(
    repeat: int, datasets: Sequence[str], levels: Sequence[int], app_levels: Collection[int]
) -> list[Measurement]:
    """Every measurement of the run in the order it is made: round by round, each round the whole sweep."""
    return [
        Measurement(number, dataset, level, target)
        for number in range(1, repeat + 1)
        for dataset in datasets
        for level in levels
        for target in (TARGETS if level in app_levels else TARGETS[:1])
    ]


def requests_per_level(level: int, per_user: int, fixed: int | None = None) -> int:
    """Requests one level sends in one round: `fixed` (--requests) as given, else per_user x level, at least 32."""
    return fixed if fixed else max(MIN_REQUESTS, per_user * level)


def requests_rule(per_user: int, fixed: int | None = None) -> str:
    """The rule above in words, for the report."""
    return f"{fixed} (fixed)" if fixed else f"max({MIN_REQUESTS}, {per_user} x concurrency)"
