"""Fitting a conversation into the model's context window: oldest turns go first, the newest message never.

The accounting. A chat template renders each message on its own between its markers, so a prompt's size is

    tokens(system + history + new) = overhead(system) + sum(cost(m) for m in history) + cost(new)

where `overhead` is what the template adds once (the BOS token, the system block or the template's default system
text, the generation prompt) and `cost(m)` what one message adds (its role markers, its text, its end marker).
So the history's messages are counted once and their counts kept with the history (`ChatSession.tokens`, saved
with each turn); a message costs one count, of itself alone (`count(system + [new])` = overhead + cost(new)), and
trimming is arithmetic on the kept counts. The template's fixed parts (`Frame`) are measured once per system text
with empty messages. A finished reply is counted after it, with its message (`count(system + [new, reply])` less
what the message took: ChatService._count_turn), off the path to the first text. The engine's usage figure
(`completion_tokens`) cannot stand for that count: the tokens a model generated need not be the tokens its text is
read as in the next prompt (a piece of a character generated alone comes back as the replacement character, which
takes more tokens: 16 random tokens of the tests' tiny model are read back as 37, in the median), and a count too
low sends a prompt the engine refuses as over its window. A message whose count is unknown (a stopped reply, a
thread saved before counts were kept, another model) is counted with its turn, once. Where a template is not
additive (it merges text across messages) the engine's count of the prompt it was sent (`prompt_tokens`) keeps the
counts right for the turns kept: the difference goes to the newest reply (ChatService._correct).

Far within the window, the new message is not counted before it is sent: a token covers at least one byte of the
text (byte-level BPE; SentencePiece with byte fallback, plus its word-start piece), so `upper_bound` bounds what it
adds without asking the engine, and where the kept counts plus that bound fit, the request goes out at once and the
message is counted after the reply (ChatService.reply), exactly, off the path to the first text. Near the budget it
is counted first, as before: trimming is always on exact counts.

A chat that outgrows the window is trimmed below the budget (`trim_to` of it) and keeps that start while the rest
fits (`fit`'s `start`, ChatSession.left_out): engines cache a prompt by its beginning, and a start that moved with
every message would have them read the whole conversation again for each one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from backend.errors import PromptTooLongError

Message = dict[str, str]  # one chat message as the OpenAI API has it: role and content (the one definition)
TokenCounter = Callable[[list[Message]], Awaitable[int]]
Counts = list[int | None]  # per message of a history: what it adds to a prompt (None: not counted yet)
FRAMES_KEPT = 64  # system texts whose Frame is kept (the API's callers bring their own: the oldest go first)


@dataclass(frozen=True)
class Fitted:
    """The messages to send, how many tokens they take, and how many old messages were left out."""

    messages: list[Message]
    prompt_tokens: int
    dropped: int
    tokens: list[int] | None = None  # every history message's count (the kept ones, and those counted now)
    new_tokens: int = 0  # what the new message adds to the next prompts, as a message of the history
    exact: bool = True  # false: prompt_tokens and new_tokens are upper bounds (the new message is counted later)


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


def head_of(system: str | None) -> list[Message]:
    """The system message a prompt begins with (none without a system text)."""
    return [{"role": "system", "content": system}] if system else []


@dataclass(frozen=True)
class Frame:
    """What the chat template adds beside the messages' texts, for one system text."""

    overhead: int  # once per prompt: BOS, the system block (or the template's default one), the generation prompt
    user: int = 0  # around each user message: its role and end markers


BOUND_MARGIN = 4  # tokens above the byte bound: a template's or tokenizer's odd piece at a message's edges


def upper_bound(frame: Frame, message: Message) -> int:
    """At least what `message` (a user message) adds to a prompt, without counting it: its markers and a token per
    byte of its text, plus one for a word-start piece and BOUND_MARGIN."""
    return frame.user + len(message.get("content", "").encode("utf-8")) + 1 + BOUND_MARGIN


@dataclass(frozen=True)
class Measured:
    """A conversation's counts before fitting: the new message with the system text alone, and each history message."""

    alone: int  # count(system + [new]): overhead + the new message (with `exact` false: an upper bound of it)
    frame: Frame  # the template's fixed parts with this system text
    tokens: list[int]  # per history message
    exact: bool = True  # false: the new message was not counted (far within the budget; upper_bound)

    @property
    def overhead(self) -> int:
        return self.frame.overhead


class Accounting:
    """The template's fixed parts (Frame, per system text: three counts of empty messages, once) and the counts of
    a history's messages. One per model and engine: another model has another tokenizer and template."""

    def __init__(self, count: TokenCounter) -> None:
        self.count = count
        self._frames: OrderedDict[str | None, Frame] = OrderedDict()

    async def frame(self, system: str | None) -> Frame:
        """The template's fixed parts with this system text. Measured on non-empty conversations (a template may
        add a default system text before the first message only: it belongs to the overhead). The last
        FRAMES_KEPT system texts' frames are kept."""
        if system in self._frames:
            self._frames.move_to_end(system)
            return self._frames[system]
        head, user, reply = head_of(system), {"role": "user", "content": ""}, {"role": "assistant", "content": ""}
        asked = await self.count([*head, user])  # overhead + user
        answered = await self.count([*head, user, reply])  # overhead + user + reply
        again = await self.count([*head, user, reply, user])  # overhead + 2 user + reply
        overhead = max(0, asked - (again - answered))
        frame = self._frames[system] = Frame(overhead, max(0, asked - overhead))
        while len(self._frames) > FRAMES_KEPT:
            self._frames.popitem(last=False)
        return frame

    async def fit_whole(
        self, history: list[Message], new_message: Message, budget: int, system: str | None = None
    ) -> Fitted | None:
        """The whole conversation, with one count of it, where it fits `budget` (None where it does not): for a
        conversation none of whose counts are kept (the API's callers send it whole each time), whose turns need
        counting one by one (measure, fit) only to trim it."""
        messages = [*head_of(system), *history, new_message]
        total = await self.count(messages)
        return Fitted(messages, total, 0) if total <= budget else None

    async def measure(
        self,
        history: list[Message],
        kept: Sequence[int | None],
        new_message: Message,
        system: str | None = None,
        budget: int | None = None,
        start: int = 0,
    ) -> Measured:
        """Count the new message (one count) and the history's turns whose counts are not kept (one each, once).
        Given the `budget`, a conversation whose counts are all kept and whose part from `start` (fit's) fits it
        with the new message's upper bound costs no count at all (`exact` false: count it later, `alone`)."""
        head = head_of(system)
        frame = await self.frame(system)
        overhead = frame.overhead
        tokens = [*kept[: len(history)], *[None] * (len(history) - len(kept))]
        if budget is not None and None not in tokens:
            bound = overhead + upper_bound(frame, new_message)
            if bound + sum(t or 0 for t in tokens[start_of_turn(history, start) :]) <= budget:
                return Measured(bound, frame, [t or 0 for t in tokens], exact=False)
        alone = await self.alone(new_message, system)
        bounds = [*turn_starts(history), len(history)] if history else [0]
        for begin, end in pairwise(bounds):
            unknown = [i for i in range(begin, end) if tokens[i] is None]
            if not unknown:
                continue
            known = sum(t or 0 for t in tokens[begin:end])
            rest = max(0, await self.count([*head, *history[begin:end]]) - overhead - known)
            for i in unknown:  # a turn's count may sit on its first unknown message: trimming is by whole turns
                tokens[i] = rest if i == unknown[0] else 0
        return Measured(alone, frame, [t or 0 for t in tokens])

    async def alone(self, new_message: Message, system: str | None = None) -> int:
        """count(system + [new]): the template's overhead and what the new message adds (one count)."""
        return await self.count([*head_of(system), new_message])


def start_of_turn(history: list[Message], start: int) -> int:
    """The start of the turn at or before message `start` (0 past the history's end: an edit shortened it)."""
    if start > len(history):
        return 0
    return max((i for i in [*turn_starts(history), len(history)] if i <= start), default=0) if history else 0


def fit(
    history: list[Message],
    new_message: Message,
    measured: Measured,
    budget: int,
    system: str | None = None,
    start: int = 0,
    trim_to: float = 1.0,
) -> Fitted:
    """Return system + a recent part of `history` (whole turns) + `new_message` within `budget`.

    The part begins at `start` (the messages an earlier fit of this conversation left out stay out) while that fits;
    otherwise it is the longest recent part within `trim_to` of the budget (1.0: the longest that fits), so a
    conversation that outgrows the window keeps one start for several messages and the engine its cache of them.
    Raises PromptTooLongError when the new message (with the system text) alone is over budget."""
    if measured.alone > budget:
        raise PromptTooLongError.of("context.too_long", tokens=measured.alone, budget=budget)
    start = start_of_turn(history, start)
    cut, total = start, measured.alone + sum(measured.tokens[start:])
    if total > budget:
        limit = max(measured.alone, int(budget * trim_to))
        cut, total = len(history), measured.alone
        ends = [*turn_starts(history), len(history)] if history else [0]
        # From the newest turn back: keep each whole turn while it fits (counts only grow as the cut moves earlier).
        for begin, end in reversed(list(pairwise(ends))):
            more = sum(measured.tokens[begin:end])
            if total + more > limit:
                break
            cut, total = begin, total + more
    new_tokens = measured.alone - measured.overhead
    messages = [*head_of(system), *history[cut:], new_message]
    return Fitted(messages, total, cut, measured.tokens, new_tokens, measured.exact)


async def fit_history(
    history: list[Message],
    new_message: Message,
    count: TokenCounter,
    budget: int,
    system: str | None = None,
    kept: Sequence[int | None] = (),
) -> Fitted:
    """measure then fit, for a conversation with the counts `kept` (none: every turn is counted once)."""
    measured = await Accounting(count).measure(history, kept, new_message, system)
    return fit(history, new_message, measured, budget, system)
