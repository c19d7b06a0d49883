"""The saved-turn format: what a reply message keeps in its metadata, and the model's history rebuilt from it.

Each reply carries, in its message metadata, the turn exactly as the model saw it (the user text after the prompt
template, the reply without the ending line a stopped or broken reply shows), the page's id of the user message that
asked it, and what the turn's two messages add to a prompt (backend.chat.context) with the model and engine that
counted them: a resumed chat fits its history into the context window without counting it again. A reply still being
written is saved as it grows, marked live: one whose app went away meanwhile (a restart, a crash) is found by that
mark and shown cut off. A resumed thread gives the model the turns in order; the app's own notices (author
"system"), Chainlit's messages and replies that produced no text are left out, as they are in a live chat."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from backend.chat.context import Counts, Message
from backend.chat.turn import turn_messages

log = logging.getLogger(__name__)
Step = TypeVar("Step", bound=Mapping[str, Any])

SYSTEM_AUTHOR = "system"  # the app's own notices: never part of the model's history
TURN_KEY = "ernie_turn"
TOKENS_KEY = "ernie_tokens"  # {"by": the model and engine that counted, "counts": [user, reply]}
ASKED_KEY = "ernie_asked"  # the page's id of the user message that asked the turn
LIVE_KEY = "ernie_live"  # the reply was still being written when this was saved
NOTICE_KEY = "ernie_notice"  # an app notice's key in backend.chat.i18n (the demo model's, the trimmed history...)
# Chainlit's stop handler says this in English beside the stopped reply (which says it in the user's language): the
# page removes it, and it is never saved.
CHAINLIT_STOP_NOTICE = "Task manually stopped."


def turn_metadata(
    user_text: str, reply_text: str, tokens: tuple[int | None, int | None] = (None, None), counted_by: str = ""
) -> dict[str, Any]:
    """Metadata for a reply message: the user and assistant messages this turn adds to the history, and their
    counts when known."""
    metadata: dict[str, Any] = {TURN_KEY: turn_messages(user_text, reply_text)}
    if counted_by and any(t is not None for t in tokens):
        metadata[TOKENS_KEY] = {"by": counted_by, "counts": list(tokens)}
    return metadata


def step_metadata(step: Mapping[str, Any]) -> dict[str, Any]:
    """A saved step's metadata as a dict (SQLite returns JSON columns as text; anything unreadable is empty)."""
    raw = step.get("metadata") or {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            return {}
    return raw if isinstance(raw, dict) else {}


def _turn(step: Mapping[str, Any]) -> list[Message]:
    turn = step_metadata(step).get(TURN_KEY)
    if not isinstance(turn, list):
        return []
    messages = [
        {"role": m["role"], "content": m["content"]}
        for m in turn
        if isinstance(m, dict) and m.get("role") in ("user", "assistant") and isinstance(m.get("content"), str)
    ]
    return messages if len(messages) == len(turn) else []


def _counts(step: Mapping[str, Any], size: int) -> tuple[Counts, str]:
    """The counts kept with a turn of `size` messages, and who counted them (([None...], "") if none are)."""
    kept = step_metadata(step).get(TOKENS_KEY)
    if isinstance(kept, dict) and isinstance(kept.get("by"), str) and isinstance(kept.get("counts"), list):
        counts = kept["counts"]
        if len(counts) == size and all(c is None or (isinstance(c, int) and c >= 0) for c in counts):
            return list(counts), kept["by"]
    return [None] * size, ""


def _saved_turns(steps: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The replies that keep a turn, oldest first."""
    ordered = sorted(steps, key=lambda s: str(s.get("createdAt") or ""))
    return [
        step
        for step in ordered
        if step.get("type") == "assistant_message" and step.get("name") != SYSTEM_AUTHOR and _turn(step)
    ]


def history_from_steps(steps: Iterable[Mapping[str, Any]]) -> list[Message]:
    """The model-facing history of a saved thread, oldest first."""
    return [message for step in _saved_turns(steps) for message in _turn(step)]


def counts_from_steps(steps: Iterable[Mapping[str, Any]]) -> tuple[Counts, str]:
    """The counts kept with history_from_steps' messages (None where none are, or another model's), and the model
    and engine that counted them: the newest turn's."""
    turns = [(_turn(step), *_counts(step, len(_turn(step)))) for step in _saved_turns(steps)]
    by = turns[-1][2] if turns else ""
    return [c for messages, counts, who in turns for c in (counts if who == by else [None] * len(messages))], by


def counts_from_thread(thread: Mapping[str, Any]) -> tuple[Counts, str]:
    """counts_from_steps for a Chainlit ThreadDict."""
    return counts_from_steps(thread.get("steps") or [])


def history_from_thread(thread: Mapping[str, Any]) -> list[Message]:
    """history_from_steps for a Chainlit ThreadDict."""
    history = history_from_steps(thread.get("steps") or [])
    log.info("Resumed thread %s: %d messages restored for the model", thread.get("id"), len(history))
    return history


def asked_ids(steps: Iterable[Mapping[str, Any]]) -> list[str]:
    """The ids of the user messages that asked a saved thread's kept turns, oldest first (an edit of one of them
    after a resume drops its turn, as in the chat that asked it)."""
    found = [step_metadata(step).get(ASKED_KEY) for step in steps]
    return [asked for asked in found if isinstance(asked, str)]


def notices(steps: Iterable[Mapping[str, Any]]) -> set[str]:
    """The keys of the app's notices a saved thread was told (a resumed chat is not told the demo model again)."""
    return {str(step_metadata(step).get(NOTICE_KEY)) for step in steps if step_metadata(step).get(NOTICE_KEY)}


def live_steps(steps: Iterable[Step]) -> list[Step]:
    """The replies saved while they were being written and not since (still live, or cut off)."""
    return [step for step in steps if step_metadata(step).get(LIVE_KEY)]
