"""Fitting a conversation into the model's context window: oldest turns go first, the newest message never."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from backend.errors import PromptTooLongError

Message = dict[str, str]
TokenCounter = Callable[[list[Message]], Awaitable[int]]


@dataclass(frozen=True)
class Fitted:
    """The messages to send, how many tokens they take, and how many old messages were left out."""

    messages: list[Message]
    prompt_tokens: int
    dropped: int


def estimate_tokens(messages: list[Message]) -> int:
    """A conservative token count for servers that cannot count: ~1 token per CJK char, ~3 chars otherwise."""
    total = 0
    for message in messages:
        text = message.get("content", "")
        wide = sum(1 for ch in text if ord(ch) > 0x2E80)
        total += wide + (len(text) - wide + 2) // 3 + 8  # + role markers of the chat template
    return total + 4


def turn_starts(history: list[Message]) -> list[int]:
    """Indexes where a turn (a user message and the replies after it) begins."""
    starts = [i for i, m in enumerate(history) if m["role"] == "user"]
    return starts if starts and starts[0] == 0 else [0, *starts]


async def fit_history(
    history: list[Message],
    new_message: Message,
    count: TokenCounter,
    budget: int,
    system: str | None = None,
) -> Fitted:
    """Return system + the longest recent part of `history` (whole turns) + `new_message` within `budget`.

    Raises PromptTooLongError when the new message (with the system text) alone is over budget."""
    head = [{"role": "system", "content": system}] if system else []
    tail = [new_message]
    starts = turn_starts(history) if history else []
    # Candidate cut points, from keeping everything to keeping nothing of the history.
    cuts = [*starts, len(history)]

    async def tokens_for(cut: int) -> int:
        return await count(head + history[cut:] + tail)

    full = await tokens_for(cuts[0])
    if full <= budget:
        return Fitted(head + history + tail, full, 0)
    alone = await tokens_for(len(history))
    if alone > budget:
        raise PromptTooLongError.of("context.too_long", tokens=alone, budget=budget)
    # Binary search for the earliest cut that fits: token counts only shrink as the cut moves later.
    lo, hi, best = 1, len(cuts) - 1, len(cuts) - 1
    best_tokens = alone
    while lo <= hi:
        mid = (lo + hi) // 2
        tokens = await tokens_for(cuts[mid])
        if tokens <= budget:
            best, best_tokens, hi = mid, tokens, mid - 1
        else:
            lo = mid + 1
    cut = cuts[best]
    return Fitted(head + history[cut:] + tail, best_tokens, cut)
