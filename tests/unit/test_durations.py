"""The order `make test` starts its groups in (tests/durations.py): longest first, by the committed figures."""

from __future__ import annotations

from tests.durations import FILE, UNKNOWN_S, known, longest_first


def test_groups_run_longest_first_keeping_their_own_order_and_unit_tests_last() -> None:
    groups = [None, "short", "long", None, "short", "long", "new", "new"]
    order = longest_first(groups, {"long": 300.0, "short": 5.0})
    assert [groups[i] for i in order] == ["long", "long", "new", "new", "short", "short", None, None]
    assert order[:2] == [2, 5] and order[-2:] == [0, 3], "a stable sort: pytest-randomly's order within a group stays"
    assert UNKNOWN_S * 2 > 5.0, "a group the file does not know counts by its tests (here 20 s: before 'short')"


def test_the_committed_figures_name_the_shared_engines_groups() -> None:
    figures = known()
    assert FILE.is_file() and {"shared-demo-vllm", "shared-tiny-vllm"} <= set(figures), figures
    assert all(isinstance(s, int | float) and s >= 0 for s in figures.values())
