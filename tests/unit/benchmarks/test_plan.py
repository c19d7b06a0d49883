"""The order of a benchmark's measurements (rounds alternated) and the requests each level gets."""

from __future__ import annotations

from backend.benchmarks.plan import MIN_REQUESTS, Measurement, requests_per_level, requests_rule, schedule


def test_rounds_alternate_the_targets_and_levels_never_all_of_one_first() -> None:
    order = [(m.round, m.level, m.target) for m in schedule(3, ["synthetic"], [1, 8], app_levels={8})]
    one_round = [(1, "server"), (8, "server"), (8, "app")]
    assert order == [(number, level, target) for number in (1, 2, 3) for level, target in one_round]
    at_8 = [target for _, level, target in order if level == 8]
    assert at_8 == ["server", "app"] * 3, "A B A B A B"


def test_each_round_holds_every_dataset_level_and_target_once() -> None:
    plan = schedule(2, ["synthetic", "prompts_zh"], [1, 2, 4], app_levels={1, 4})
    per_round = [[(m.dataset, m.level, m.target) for m in plan if m.round == n] for n in (1, 2)]
    assert per_round[0] == per_round[1]
    assert len(per_round[0]) == len(set(per_round[0])) == 2 * (3 + 2)
    assert plan[0] == Measurement(1, "synthetic", 1, "server") and plan[1] == Measurement(1, "synthetic", 1, "app")
    assert schedule(1, ["synthetic"], [1], app_levels=()) == [Measurement(1, "synthetic", 1, "server")]


def test_every_level_gets_at_least_32_requests_unless_a_fixed_number_is_asked() -> None:
    assert MIN_REQUESTS == 32
    assert [requests_per_level(level, per_user=4) for level in (1, 4, 8, 16, 64)] == [32, 32, 32, 64, 256]
    assert requests_per_level(1, per_user=100) == 100
    assert requests_per_level(64, per_user=4, fixed=3) == 3, "--requests is taken as given"
    assert requests_rule(4) == "max(32, 4 x concurrency)" and requests_rule(4, 3) == "3 (fixed)"
