"""Fitting the conversation into the context window: whole oldest turns go first, the newest message never."""

from __future__ import annotations

import pytest

from backend.chat.context import estimate_tokens, fit_history, turn_starts
from backend.errors import PromptTooLongError

Message = dict[str, str]


async def words(messages: list[Message]) -> int:
    """A transparent counter for these tests: one token per word plus 2 per message."""
    return sum(len(m["content"].split()) + 2 for m in messages)


def conversation(turns: int) -> list[Message]:
    out: list[Message] = []
    for i in range(turns):
        out += [{"role": "user", "content": f"question {i} " * 5}, {"role": "assistant", "content": f"answer {i} " * 5}]
    return out


async def test_everything_fits_nothing_dropped() -> None:
    history = conversation(2)
    new = {"role": "user", "content": "hello"}
    fitted = await fit_history(history, new, words, budget=1000, system="be kind")
    assert fitted.dropped == 0
    assert fitted.messages[0] == {"role": "system", "content": "be kind"}
    assert fitted.messages[-1] == new
    assert fitted.prompt_tokens == await words(fitted.messages)


async def test_oldest_whole_turns_are_dropped_first() -> None:
    history = conversation(4)  # each message: 10 words + 2 = 12 tokens; a turn = 24
    new = {"role": "user", "content": "newest message here"}  # 5 tokens
    fitted = await fit_history(history, new, words, budget=5 + 24 * 2)
    assert fitted.dropped == 4  # two oldest turns
    assert fitted.messages[0]["content"].startswith("question 2")
    assert fitted.messages[-1] == new
    assert fitted.prompt_tokens <= 5 + 48
    # the kept part is the longest suffix that fits: one more turn would not
    assert await words([*history[2:], new]) > 5 + 48


async def test_newest_message_is_never_cut() -> None:
    new = {"role": "user", "content": "word " * 100}
    with pytest.raises(PromptTooLongError) as err:
        await fit_history(conversation(3), new, words, budget=50)
    assert err.value.params["tokens"] == 102 and err.value.params["budget"] == 50
    assert "Shorten" in str(err.value)


async def test_system_text_counts_and_is_kept() -> None:
    history = conversation(1)
    new = {"role": "user", "content": "x"}
    fitted = await fit_history(history, new, words, budget=3 + 7, system="one two three four five")
    assert fitted.dropped == 2 and [m["role"] for m in fitted.messages] == ["system", "user"]


async def test_history_starting_with_assistant_is_handled() -> None:
    history = [{"role": "assistant", "content": "welcome " * 10}, *conversation(1)]
    assert turn_starts(history) == [0, 1]
    fitted = await fit_history(history, {"role": "user", "content": "hi"}, words, budget=3 + 24)
    assert fitted.dropped == 1


def test_estimate_is_conservative_for_chinese() -> None:
    zh = [{"role": "user", "content": "请总结下面这段话" * 10}]
    assert estimate_tokens(zh) >= 80
