"""Benchmark workloads: the shipped Chinese prompt set, prompt-set files with mistakes, exact-length prompts."""

from __future__ import annotations

import logging
import re
from collections import Counter
from pathlib import Path

import pytest

from backend.benchmarks.workload import (
    CATEGORIES,
    DEFAULT_PROMPT_SET,
    PromptSetWorkload,
    SyntheticWorkload,
    Tagger,
    WorkloadError,
    fit_words,
    load_prompt_set,
)

HAN = re.compile(r"[\u4e00-\u9fff]")


def test_shipped_prompt_set_is_varied_chinese() -> None:
    items = load_prompt_set(DEFAULT_PROMPT_SET)
    assert len(items) >= 40
    assert len({i.id for i in items}) == len(items)
    per_category = Counter(i.category for i in items)
    assert set(per_category) == set(CATEGORIES)
    assert min(per_category.values()) >= 6
    assert all(HAN.search(i.prompt) for i in items)
    assert all(16 <= i.max_tokens <= 512 for i in items)
    # interleaved, so that a short level still mixes kinds of requests
    assert len({i.category for i in items[:5]}) == 5


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 2: not valid JSON"),
        ('["a list"]', "line 2: expected a JSON object"),
        ('{"prompt": "hi", "max_tokens": 8, "temp": 1}', "unknown field(s) temp"),
        ('{"prompt": "", "max_tokens": 8}', "'prompt' must be a non-empty string"),
        ('{"prompt": "hi", "max_tokens": "8"}', "'max_tokens' must be an integer"),
        ('{"prompt": "hi", "max_tokens": true}', "'max_tokens' must be an integer"),
        ('{"prompt": "hi", "max_tokens": 8, "system": 3}', "'system' must be a string"),
    ],
)
def test_prompt_set_mistakes_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text('{"prompt": "你好", "max_tokens": 8}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(WorkloadError) as info:
        load_prompt_set(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)


def test_missing_or_empty_prompt_set(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="does not exist"):
        load_prompt_set(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n", encoding="utf-8")
    with pytest.raises(WorkloadError, match="holds no prompts"):
        load_prompt_set(tmp_path / "empty.jsonl")


async def test_prompt_set_levels_get_the_same_prompts_with_unique_tags() -> None:
    items = load_prompt_set(DEFAULT_PROMPT_SET)
    workload = PromptSetWorkload(items, Tagger())
    first, again = await workload.take(3), await workload.take(3)
    for a, b, item in zip(first, again, items, strict=False):
        assert a.messages[-1]["content"].endswith(item.prompt) and b.messages[-1]["content"].endswith(item.prompt)
        assert a.messages[-1]["content"] != b.messages[-1]["content"]  # the tags differ
        assert a.max_tokens == item.max_tokens
    cycled = await workload.take(len(items) + 2)
    assert cycled[-1].label == items[1].id
    fixed = await PromptSetWorkload(items, Tagger(), output_len=32).take(4)
    assert {r.max_tokens for r in fixed} == {32}


async def test_fit_words_finds_the_largest_count_within_the_target() -> None:
    calls: list[int] = []

    async def measure(k: int) -> int:
        calls.append(k)
        return 10 + 2 * k

    assert await fit_words(measure, 31, guess=3, most=100) == 10  # 30 fits, 32 does not
    assert await fit_words(measure, 30, guess=50, most=100) == 10  # exact
    assert await fit_words(measure, 5, guess=4, most=100) == 0  # nothing fits
    assert len(calls) < 30


def fake_count(text: str) -> int:
    """A stand-in tokenizer: 3 template tokens, 2 per word, 1 per '。'."""
    return 3 + 2 * len(text.split()) + text.count("。")


async def test_synthetic_prompts_hit_the_exact_length() -> None:
    async def count(messages: list[dict[str, str]]) -> int:
        return fake_count(messages[-1]["content"])

    for target in (40, 41, 257):
        workload = SyntheticWorkload(target, 16, Tagger(), count, seed=1)
        requests = await workload.take(3)
        assert [fake_count(r.messages[-1]["content"]) for r in requests] == [target] * 3
        assert len({r.messages[-1]["content"] for r in requests}) == 3
        assert {r.max_tokens for r in requests} == {16}


async def test_synthetic_prompts_without_a_token_counter_are_estimates(caplog: pytest.LogCaptureFixture) -> None:
    asked: list[int] = []

    async def cannot(messages: list[dict[str, str]]) -> None:
        asked.append(1)
        return None  # like a server without /tokenize

    caplog.set_level(logging.WARNING, logger="backend.benchmarks.workload")
    short = await SyntheticWorkload(150, 8, Tagger(), cannot).take(2)
    warnings = [r for r in caplog.records if "cannot count tokens" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING", "the estimate is announced once"
    assert asked == [1], "a server that cannot count is asked once, not for every prompt"
    assert [r.max_tokens for r in short] == [8, 8]
    assert short[0].messages[-1]["content"] != short[1].messages[-1]["content"], "each prompt has its own tag"
    # An estimate still follows the length asked for: four times the tokens, more words.
    long = await SyntheticWorkload(600, 8, Tagger(), cannot).take(1)
    assert len(long[0].messages[-1]["content"].split()) > len(short[0].messages[-1]["content"].split())
