"""One chat turn as the UI sees it: the session it belongs to, and the events ChatService.reply() yields.

The UI (backend/web/) renders each event and decides nothing: whether the message is sent, how long to wait for the
engine, what the model is asked and what is recorded are the service's.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from backend.chat.client import StreamStats
from backend.chat.context import Counts, Message
from backend.chat.request import UserSettings
from backend.chat.sources import Source
from backend.errors import Phrase, ServiceError
from backend.prompts.schema import Reason


def turn_messages(user_text: str, reply_text: str) -> list[Message]:
    """The messages one finished turn adds to the history, as the model saw them."""
    return [{"role": "user", "content": user_text}, {"role": "assistant", "content": reply_text}]


@dataclass
class ChatSession:
    """What one browser chat keeps between turns."""

    settings: UserSettings
    history: list[Message] = field(default_factory=list)  # the turns as the model saw them, oldest first
    template_problems: list[str] = field(default_factory=list)  # the problems this chat was already told about
    demo_told: bool = False  # whether this chat was told that the demo model answers
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one reply at a time: sends queue up
    # The page's id of the user message of each of the latest turns (a resumed chat's earlier turns have none).
    turn_ids: list[str] = field(default_factory=list)
    # What each message of the history adds to a prompt (backend.chat.context), as `counted_by` counted it.
    tokens: Counts = field(default_factory=list)
    counted_by: str = ""
    # The oldest history messages the model no longer sees (the last trim, backend.chat.context.fit): kept out
    # while the rest fits, so the engine's cache of the part sent stays good.
    left_out: int = 0
    # Whom the line in front of the engine counts this chat as (backend.chat.admission: each owner's requests wait
    # behind each other, not in front of another's): the login name, else the browser session.
    line_owner: str = ""
    owner: str | None = None  # whose documents the chat's messages are answered from (None: no documents)

    def add_turn(
        self,
        user_text: str,
        reply_text: str,
        message_id: str = "",
        tokens: tuple[int | None, int | None] = (None, None),
    ) -> None:
        """Keep a finished turn, as the model saw it, with the id of the user message that asked it and the counts
        of its two messages (None: not known)."""
        self.tokens = self.kept_tokens() + list(tokens)
        self.history += turn_messages(user_text, reply_text)
        self.turn_ids.append(message_id)

    def kept_tokens(self) -> Counts:
        """The counts kept for the history, one per message (None where none is kept)."""
        known = self.tokens[: len(self.history)]
        return [*known, *[None] * (len(self.history) - len(known))]

    def forget_from(self, message_id: str) -> int:
        """Drop the turn asked by `message_id` and every later one (the message was edited, or its reply is asked
        again); return how many turns were dropped (0: no turn of that message is kept)."""
        if not message_id or message_id not in self.turn_ids:
            return 0
        dropped = len(self.turn_ids) - self.turn_ids.index(message_id)
        self.history = self.history[: len(self.history) - 2 * dropped]
        self.tokens = self.tokens[: len(self.history)]
        del self.turn_ids[-dropped:]
        if self.left_out >= len(self.history):
            self.left_out = 0  # the turns kept for the model were dropped: fit anew
        return dropped


@dataclass(frozen=True)
class Notice:
    """A line from the app, not the model: a key of backend.chat.i18n with its parameters."""

    key: str
    params: dict[str, Any] = field(default_factory=dict)
    items: tuple[str, ...] = ()  # a list shown under the line (the templates' problems)


@dataclass(frozen=True)
class Refused:
    """The message was not sent to the model, and why (empty, too large, unknown template, too long...)."""

    error: ServiceError


EngineState = Literal["starting", "restarting", "ready", "failed", "not_ready"]
Ending = Literal["finished", "stopped", "interrupted", "failed"]


@dataclass(frozen=True)
class EngineWait:
    """The engine is not ready for this message: one notice the UI shows and then updates."""

    state: EngineState
    elapsed_s: float  # since this message started waiting
    problem: ServiceError | None = None  # what went wrong (restarting, failed)
    log_tail: str = ""
    log_path: Path | None = None
    progress: Phrase | None = None  # what the start is doing meanwhile (measuring the engines at a first start)
    warmup_s: float | None = None  # ready: what the start's warm-up took (None: none ran)


@dataclass(frozen=True)
class Queued:
    """Every place of the engine is taken: this message waits in line (one notice the UI shows and updates)."""

    place: int  # 1: next; 0: its turn came (then wait_s is how long it waited)
    wait_s: float | None  # the expected seconds until it runs (None: not measured yet); once running: the wait
    late: bool = False  # it has waited longer than the line's bound (the wait was expected shorter)


@dataclass(frozen=True)
class Started:
    """The request goes to the engine now: the reply begins (after every notice), asked with this user text."""

    user_text: str  # the user message as the model sees it (after the template)


@dataclass(frozen=True)
class Text:
    """More of the reply's text (coalesced for the browser)."""

    text: str


@dataclass(frozen=True)
class Done:
    """The reply ended: its whole text, which template answered and why, and how it ended."""

    text: str
    template: str
    reason: Reason
    user_text: str  # the user message as the model saw it (after the template)
    ending: Ending = "finished"
    error: ServiceError | None = None
    stats: StreamStats | None = None  # what the stream measured (timings, the engine's token counts)
    prompt_tokens: int = 0  # the prompt's size as the request counted it (when the engine reports no usage)
    tokens: tuple[int | None, int | None] = (None, None)  # what the turn's two messages add to later prompts
    counted_by: str = ""  # the model and engine those counts are of (ChatService.counter_id)
    sources: tuple[Source, ...] = ()  # the passages of the user's documents the model was given

    @property
    def usage(self) -> tuple[int | None, int | None]:
        """(prompt, reply) tokens of the turn as its details show them: the engine's usage, else the prompt as the
        request counted it (None: not known)."""
        return self.stats.tokens(self.prompt_tokens) if self.stats else (self.prompt_tokens or None, None)

    @property
    def counted(self) -> tuple[int, int]:
        """(prompt, reply) tokens of the turn as the user's quota and the metrics count them (StreamStats.counted, as
        the API counts a request's)."""
        return self.stats.counted(self.prompt_tokens) if self.stats else (self.prompt_tokens, 0)


@dataclass(frozen=True)
class Serving:
    """What answers, for the first page: model, engine, device, and the engine's state on one clock."""

    model: str
    engine: str  # "" while engine.name auto has not chosen one yet
    device: str  # "CPU", "GPU", or "" where the app cannot know (an external server)
    state: str  # backend.serving.supervisor.State's value
    elapsed_s: float  # in that state (starting: since the engine began to start)
    demo: bool = False  # the offline demo model answers
    progress: Phrase | None = None  # what the start is doing meanwhile (the engine tune at a first start)


Event = Notice | Refused | EngineWait | Queued | Started | Text | Done
