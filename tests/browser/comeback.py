"""What the comeback tests read in the page and the engine: the chat's events as the page received them (the reply's
raw text, not its rendered Markdown), and the engine's own token count of a text."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from playwright.async_api import Error as PlaywrightError

from tests.app_process import SharedEngine

LONG_ASK = "Tell me a long story about a small robot who learns to paint, with many details."


class Frames:
    """The chat's socket.io events a page received, each with the time it came (time.monotonic()); a refused
    connection is the event "(refused)".

    Chainlit leaves Socket.IO's transports at the client's default: a connection begins on HTTP long-polling and
    moves to a websocket. What the server answers before the move (a refusal of the connection comes that soon, at
    times) is in a polling response, not a websocket frame: both are read."""

    def __init__(self, page: Any) -> None:
        self.events: list[tuple[float, str, Any]] = []
        page.on("websocket", self._socket)
        page.on("response", self._polled)

    def _socket(self, ws: Any) -> None:
        self.events.append((time.monotonic(), "(connected)", None))
        ws.on("framereceived", self._frame)

    async def _polled(self, response: Any) -> None:
        """A long-polling response's Engine.IO packets (separated by the record separator), each read as a frame."""
        if "/ws/socket.io/" not in response.url or "transport=polling" not in response.url:
            return
        if response.request.method != "GET":
            return
        try:
            body = await response.text()
        except PlaywrightError:  # the page was closed or navigated away meanwhile
            return
        for packet in body.split("\x1e"):
            self._frame(packet)

    def _frame(self, payload: str | bytes) -> None:
        if isinstance(payload, str) and payload.startswith("44"):  # Socket.IO's CONNECT_ERROR: the server refused
            self.events.append((time.monotonic(), "(refused)", payload[2:]))
        if not isinstance(payload, str) or not payload.startswith("42"):
            return
        try:
            event, *args = json.loads(payload[2:])
        except ValueError:
            return
        self.events.append((time.monotonic(), event, args[0] if args else None))

    def mark(self) -> int:
        """Where the events from now on begin."""
        return len(self.events)

    def newest_socket(self) -> int:
        """Where the events of the page's newest websocket begin (after a reload: the reloaded page's)."""
        return max(i for i, (_, event, _) in enumerate(self.events) if event == "(connected)")

    def reply_id(self, since: int = 0) -> str | None:
        """The id of the first model reply the page was sent after `since` (the app's notices left out)."""
        for _, event, data in self.events[since:]:
            for message in _messages(event, data):
                if message.get("type") == "assistant_message" and message.get("name") != "system":
                    return str(message["id"])
        return None

    def text(self, reply_id: str, since: int = 0) -> str:
        """The reply's text as the page has it from the events after `since`."""
        text = ""
        for _, event, data in self.events[since:]:
            if event == "resume_thread":  # a saved thread: its steps at once
                text = next((str(m.get("output")) for m in _messages(event, data) if m.get("id") == reply_id), text)
            if not isinstance(data, dict) or data.get("id") != reply_id:
                continue
            if event in ("stream_start", "new_message", "update_message"):
                text = str(data.get("output") or "")
            elif event == "stream_token":
                text = str(data["token"]) if data.get("isSequence") else text + str(data["token"])
        return text

    def pieces(self, reply_id: str, since: int = 0) -> list[tuple[float, str, Any]]:
        """The events that carried the reply's text after `since`."""
        return [
            (at, event, data)
            for at, event, data in self.events[since:]
            if event in ("stream_start", "stream_token", "update_message")
            and isinstance(data, dict)
            and data.get("id") == reply_id
        ]

    def first_at(self, event: str, since: int = 0) -> float | None:
        """When the first `event` after `since` came (time.monotonic()), or None."""
        return next((at for at, name, _ in self.events[since:] if name == event), None)

    def ended_at(self, reply_id: str, since: int = 0) -> float | None:
        """When the finished reply (its last full update) came after `since`, or None."""
        ends = [at for at, event, data in self.events[since:] if event in ("update_message", "new_message")
                and isinstance(data, dict) and data.get("id") == reply_id]  # fmt: skip
        return ends[-1] if ends else None

    def final(self, reply_id: str, since: int = 0) -> dict[str, Any] | None:
        """The reply's last full update after `since` (the finished reply, with its metadata)."""
        found = [data for _, event, data in self.events[since:] if event in ("update_message", "new_message")]
        ours = [data for data in found if isinstance(data, dict) and data.get("id") == reply_id]
        return ours[-1] if ours else None


def _messages(event: str, data: Any) -> list[dict[str, Any]]:
    """The messages an event brings: one (a new or streamed one), or a resumed thread's steps."""
    if event == "resume_thread" and isinstance(data, dict):
        return [step for step in data.get("steps") or [] if isinstance(step, dict)]
    if event in ("stream_start", "new_message") and isinstance(data, dict):
        return [data]
    return []


def engine_tokens(engine: SharedEngine, text: str) -> int:
    """The engine's own count of `text` (vLLM's /tokenize)."""
    body = json.dumps({"model": engine.served_name, "prompt": text, "add_special_tokens": False}).encode()
    request = urllib.request.Request(engine.base_url + "/tokenize", data=body, method="POST")
    request.add_header("Authorization", f"Bearer {engine.api_key}")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as resp:
        return int(json.loads(resp.read())["count"])
