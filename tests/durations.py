"""What each group of tests took in a recent `make test`, so that the longest start first.

pytest-xdist's loadgroup sends each group (a shared engine's modules, else one module) to the first free test process
in the order the groups are collected (`--no-loadscope-reorder`; its own reorder sorts by the number of tests, which
put the one-test tune module, ~5 min, among the last). Sorting the groups by their seconds, longest first, leaves
the short ones and the unit tests (each a group of its own) to fill in at the end, whatever order pytest-randomly
gave them. The figures only order the run; a group missing from the file counts 10 s a test. Refresh after a change
that moves a group by minutes:

    .venv/bin/python -m pytest ... --junitxml=junit.xml   (as `make test` runs, two processes)
    .venv/bin/python -m tests.durations junit.xml          (rewrites tests/durations.json)
"""

from __future__ import annotations

import collections
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

FILE = Path(__file__).with_name("durations.json")
UNKNOWN_S = 10.0  # a test of a group the file does not hold


def group_of(name: str) -> str | None:
    """The xdist group in a test name as pytest-xdist reports it ("test_x[p]@group"), None for unit tests."""
    return name.rsplit("@", 1)[1] if "@" in name else None


def from_junit(path: Path) -> dict[str, float]:
    seconds: collections.Counter[str] = collections.Counter()
    for case in ET.parse(path).getroot().iter("testcase"):
        group = group_of(case.get("name", ""))
        if group is not None:
            seconds[group] += float(case.get("time", 0))
    return {group: round(s) for group, s in seconds.most_common()}


def known() -> dict[str, float]:
    return json.loads(FILE.read_text(encoding="utf-8")) if FILE.is_file() else {}


def longest_first(groups: list[str | None], figures: dict[str, float]) -> list[int]:
    """Indices of `groups` (each test's group, None for a unit test) in run order: the groups by their seconds,
    longest first (a stable sort: the tests of a group keep their order), unit tests last."""
    counts = collections.Counter(g for g in groups if g is not None)
    cost = {g: figures.get(g, UNKNOWN_S * n) for g, n in counts.items()}
    return sorted(range(len(groups)), key=lambda i: -cost[groups[i]] if groups[i] is not None else 0.0)  # type: ignore[index]


@pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle and the groups given in tests/conftest.py
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("dist", None) != "loadgroup":
        return  # one process, or xdist's other modes: the order does not matter
    marks = [item.get_closest_marker("xdist_group") for item in items]
    groups = [str(m.args[0]) if m is not None and m.args else None for m in marks]
    items[:] = [items[i] for i in longest_first(groups, known())]


if __name__ == "__main__":
    FILE.write_text(json.dumps(from_junit(Path(sys.argv[1])), indent=1) + "\n", encoding="utf-8")
    print(f"{FILE}: {len(known())} groups")
