"""Fitting the conversation into the context window: whole oldest turns go first, the newest message never."""

from __future__ import annotations

import pytest

from backend.chat.context import (
    BOUND_MARGIN,
    FRAMES_KEPT,
    Accounting,
    Frame,
    estimate_tokens,
    fit,
    fit_history,
    turn_starts,
    upper_bound,
)
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


class Template:
    """A counter like a real chat template: a BOS token and a default system text before the first message (4),
    a generation prompt (2), each message its text's words plus 3 markers. It records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[list[Message]] = []

    async def __call__(self, messages: list[Message]) -> int:
        self.asked.append(messages)
        default_system = 3 if messages and messages[0]["role"] != "system" else 0
        return 1 + default_system + sum(len(m["content"].split()) + 3 for m in messages) + 2


async def test_the_frame_is_measured_once_and_holds_the_default_system_text() -> None:
    template = Template()
    accounting = Accounting(template)
    assert await accounting.frame(None) == Frame(overhead=1 + 3 + 2, user=3)
    assert await accounting.frame("be brief") == Frame(overhead=1 + 5 + 2, user=3)  # system: 2 words + 3
    asked = len(template.asked)
    await accounting.frame(None)
    await accounting.frame("be brief")
    assert len(template.asked) == asked == 6, "three counts per system text, once"


async def test_frames_are_kept_for_the_latest_system_texts_only() -> None:
    """The API's callers bring system texts of their own: the frames kept are bounded, the oldest measured again."""
    template = Template()
    accounting = Accounting(template)
    for i in range(FRAMES_KEPT + 1):
        await accounting.frame(f"system {i}")
    asked = len(template.asked)
    await accounting.frame(f"system {FRAMES_KEPT}")  # the newest: kept
    assert len(template.asked) == asked
    await accounting.frame("system 0")  # the oldest: gone, measured again
    assert len(template.asked) == asked + 3


async def test_kept_counts_make_a_long_conversation_cost_one_small_count() -> None:
    template = Template()
    accounting = Accounting(template)
    history = conversation(50)
    kept = [len(m["content"].split()) + 3 for m in history]  # what each message adds: 13
    await accounting.frame(None)
    template.asked.clear()
    new = {"role": "user", "content": "newest message here"}
    measured = await accounting.measure(history, kept, new)
    assert template.asked == [[new]], "one count, of the new message alone"
    fitted = fit(history, new, measured, budget=10_000)
    assert fitted.prompt_tokens == await template([*history, new]), "exact"
    assert fitted.new_tokens == 3 + 3


async def test_trimming_on_kept_counts_is_exact_at_the_budget() -> None:
    template = Template()
    history = conversation(10)
    kept = [len(m["content"].split()) + 3 for m in history]
    new = {"role": "user", "content": "newest message here"}
    exact = await template([*history[4:], new])  # keep three turns
    measured = await Accounting(template).measure(history, kept, new)
    at = fit(history, new, measured, budget=exact)
    assert (at.dropped, at.prompt_tokens) == (4, exact) and at.messages == [*history[4:], new]
    under = fit(history, new, measured, budget=exact - 1)
    assert under.dropped == 6 and under.prompt_tokens == await template([*history[6:], new])


async def test_turns_without_kept_counts_are_counted_once_each() -> None:
    template = Template()
    accounting = Accounting(template)
    history = conversation(3)
    await accounting.frame(None)
    template.asked.clear()
    kept = [13, 13, None, None, 13, None]  # the second turn unknown; the third turn's reply unknown
    new = {"role": "user", "content": "hi"}
    measured = await accounting.measure(history, kept, new)
    assert template.asked == [[new], history[2:4], history[4:6]]
    assert sum(measured.tokens[2:4]) == 26 and measured.tokens[4:6] == [13, 13]
    assert fit(history, new, measured, budget=10_000).prompt_tokens == await template([*history, new])


async def test_far_within_the_budget_the_new_message_is_not_counted_near_it_it_is() -> None:
    template = Template()
    accounting = Accounting(template)
    history = conversation(3)
    kept = [len(m["content"].split()) + 3 for m in history]  # 13 each: 78
    frame = await accounting.frame(None)
    template.asked.clear()
    new = {"role": "user", "content": "three short words"}  # 6 tokens; 17 bytes
    bound = upper_bound(frame, new)
    assert bound == 3 + 17 + 1 + BOUND_MARGIN >= await template([new]) - frame.overhead
    template.asked.clear()
    far = await accounting.measure(history, kept, new, budget=frame.overhead + 78 + bound)
    assert template.asked == [] and not far.exact and far.alone == frame.overhead + bound, "at the bound: uncounted"
    fitted = fit(history, new, far, frame.overhead + 78 + bound)
    assert (fitted.dropped, fitted.exact, fitted.prompt_tokens) == (0, False, frame.overhead + 78 + bound)
    near = await accounting.measure(history, kept, new, budget=frame.overhead + 78 + bound - 1)
    assert template.asked == [[new]] and near.exact and near.alone == frame.overhead + 6, "one under: counted"
    template.asked.clear()
    unknown = await accounting.measure(history, [*kept[:-1], None], new, budget=100_000)
    assert unknown.exact and [new] in template.asked, "a history count not kept: everything counted, as before"
    assert (await accounting.measure(history, kept, new)).exact, "no budget given: counted"


async def test_a_trim_goes_down_to_its_share_and_the_start_stays_while_the_rest_fits() -> None:
    history = conversation(10)  # 20 messages of 12 tokens (words): a turn is 24
    tokens = [12] * 20
    new = {"role": "user", "content": "newest message here"}  # 5 tokens
    measured = await Accounting(words).measure(history, tokens, new)
    # everything: 5 + 240 = 245; a budget of 200 drops 2 turns (4 messages), down to 3/4 of it (150): 4 turns
    longest = fit(history, new, measured, 200)
    assert longest.dropped == 4 and longest.prompt_tokens == 5 + 8 * 24, "1.0: the longest part that fits"
    trimmed = fit(history, new, measured, 200, start=0, trim_to=0.75)
    assert trimmed.dropped == 8 and trimmed.prompt_tokens == 5 + 6 * 24 <= 150
    # the next message (the chat grew by a turn) keeps that start while the rest fits: the same prefix is sent
    grown = [*history, *conversation(1)]
    measured = await Accounting(words).measure(grown, [12] * 22, new)
    kept = fit(grown, new, measured, 200, start=trimmed.dropped, trim_to=0.75)
    assert kept.dropped == 8 and kept.messages[0] == trimmed.messages[0] and kept.prompt_tokens == 5 + 7 * 24
    # a start that is not a turn's start is taken back to its turn's; past the history's end (an edit): from 0
    assert fit(grown, new, measured, 200, start=9, trim_to=0.75).dropped == 8
    assert (
        fit(conversation(2), new, await Accounting(words).measure(conversation(2), [12] * 4, new), 200, start=8).dropped
        == 0
    )
