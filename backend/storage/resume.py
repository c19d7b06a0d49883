"""Resuming a saved conversation: the model-facing history rebuilt from the thread's steps.

Each finished reply carries, in its message metadata, the turn exactly as the model saw it (the user
text after the prompt template, the reply without the ending line a stopped or broken reply shows). A
resumed thread gives the model those turns in order; the app's own notices (author "system"), Chainlit's messages and
replies that produced no text are left out, as they are in a live chat."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from backend.chat.context import Message
from backend.chat.turn import turn_messages

log = logging.getLogger(__name__)

TURN_KEY = "ernie_turn"
SYSTEM_AUTHOR = "system"


def turn_metadata(user_text: str, reply_text: str) -> dict[str, list[Message]]:
    """Metadata for a reply message: the user and assistant messages this turn adds to the history."""
    return {TURN_KEY: turn_messages(user_text, reply_text)}


def _metadata(step: Mapping[str, Any]) -> dict[str, Any]:
    raw = step.get("metadata") or {}
    if isinstance(raw, str):  # SQLite returns JSON columns as text
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            return {}
    return raw if isinstance(raw, dict) else {}


def _turn(step: Mapping[str, Any]) -> list[Message]:
    turn = _metadata(step).get(TURN_KEY)
    if not isinstance(turn, list):
        return []
    messages = [
        {"role": m["role"], "content": m["content"]}
        for m in turn
        if isinstance(m, dict) and m.get("role") in ("user", "assistant") and isinstance(m.get("content"), str)
    ]
    return messages if len(messages) == len(turn) else []


def history_from_steps(steps: Iterable[Mapping[str, Any]]) -> list[Message]:
    """The model-facing history of a saved thread, oldest first."""
    ordered = sorted(steps, key=lambda s: str(s.get("createdAt") or ""))
    history: list[Message] = []
    for step in ordered:
        if step.get("type") != "assistant_message" or step.get("name") == SYSTEM_AUTHOR:
            continue
        history += _turn(step)
    return history


def history_from_thread(thread: Mapping[str, Any]) -> list[Message]:
    """history_from_steps for a Chainlit ThreadDict."""
    history = history_from_steps(thread.get("steps") or [])
    log.info("Resumed thread %s: %d messages restored for the model", thread.get("id"), len(history))
    return history
