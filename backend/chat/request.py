"""What one reply is asked with: the session's sampling settings, the cleaned message, the request to the engine."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from backend.chat.context import Frame, Message
from backend.chat.sources import Source
from backend.config import AppConfig
from backend.errors import InvalidInputError
from backend.prompts.schema import Reason

CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# What the settings panel changes: key -> (lowest, highest, step) of its slider.
SETTING_RANGES: dict[str, tuple[float, float, float]] = {
    "temperature": (0, 2, 0.05),
    "top_p": (0.05, 1, 0.05),
    "max_tokens": (16, 4096, 16),
}
SETTING_KEYS = tuple(SETTING_RANGES)


@dataclass
class UserSettings:
    """Sampling settings one chat session chose; `changed` holds those the user moved from the defaults."""

    temperature: float
    top_p: float
    max_tokens: int
    template: str | None = None
    changed: set[str] = field(default_factory=set)

    @classmethod
    def defaults(cls, cfg: AppConfig, demo: bool = False) -> UserSettings:
        """The settings panel's starting values: the chat defaults, or the demo model's while it answers."""
        base = cfg.demo if demo else cfg.chat
        return cls(base.temperature, base.top_p, base.max_tokens)

    def update(self, values: dict[str, Any], cfg: AppConfig, demo: bool = False) -> None:
        """Apply values from the settings panel, remembering which differ from the configured defaults."""
        base = UserSettings.defaults(cfg, demo)
        for key in SETTING_KEYS:
            if key in values and values[key] is not None:
                value = int(values[key]) if key == "max_tokens" else float(values[key])
                setattr(self, key, value)
                if value != getattr(base, key):
                    self.changed.add(key)
                else:
                    self.changed.discard(key)
        if "template" in values:
            name = values["template"]
            self.template = None if name in (None, "", "auto") else str(name)


@dataclass(frozen=True)
class ChatRequest:
    """What goes to the engine for one reply, and what the UI should tell the user about it."""

    messages: list[Message]
    sampling: dict[str, Any]
    template: str
    reason: Reason  # why this template: a keyword, a pattern, the user's choice
    user_text: str  # the rendered user message, as kept in the history
    prompt_tokens: int
    dropped: int
    history_tokens: list[int] = field(default_factory=list)  # every history message's count (backend.chat.context)
    user_tokens: int | None = 0  # what the user message adds to later prompts (None: not known)
    # sent uncounted, far within the window (backend.chat.context.upper_bound): what to count after the reply
    # (the system text and the new message); prompt_tokens and user_tokens are upper bounds until then
    uncounted: list[Message] | None = None
    # the template's fixed parts with the system text sent (its overhead: what a count of the message alone adds)
    frame: Frame = field(default_factory=lambda: Frame(0))
    sources: list[Source] = field(default_factory=list)  # passages of the user's documents sent with the message


def _invisible(ch: str) -> bool:
    """White space, or a format character that shows nothing (zero-width space and joiners, word joiner, BOM)."""
    return ch.isspace() or unicodedata.category(ch) == "Cf"


def clean_input(text: str, max_chars: int) -> str:
    """Return the message without control characters or invalid Unicode; refuse invisible (empty) or oversized ones."""
    text = text.encode("utf-8", "replace").decode("utf-8")
    text = CONTROL_CHARS.sub("", text)
    if all(_invisible(ch) for ch in text):
        raise InvalidInputError.of("input.empty")
    if len(text) > max_chars:
        raise InvalidInputError.of("input.too_large", chars=len(text), limit=max_chars)
    return text
