"""A client of the running app's websocket (Socket.IO), speaking to it as the chat page does: connect, send,
wait for events, read the replies. The load tool drives many of these; the tests use it to chat with a real app."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx

from backend.chat.render import DETAILS_KEY
from backend.chat.saved import TURN_KEY

WAIT_S = 180  # a reply may wait for a (re)starting engine


def reply_finished(step: dict[str, Any]) -> bool:
    """Whether a reply's step shows it finished: its details in the metadata (backend.chat.render.DETAILS_KEY), and
    the model's text alone as the output (its metadata keeps the text, for the history). A stopped, interrupted or
    failed reply has an ending line after its text; a reply with no text at all keeps no turn and shows nothing. The
    model's words are not looked at."""
    metadata = step.get("metadata") or {}
    turn = metadata.get(TURN_KEY) or []
    text = str(turn[1]["content"]) if len(turn) == 2 else ""
    return DETAILS_KEY in metadata and str(step.get("output", "")) == text


class ChatSocket:
    """One chat session over Chainlit's socket.io endpoint."""

    def __init__(self, url: str, http: httpx.AsyncClient | None, language: str = "en-US") -> None:
        import socketio  # the UI's client library: imported here so `python -m backend` loads without it

        self.url, self.http, self.language = url, http, language
        # A browser starts with HTTP long-polling and upgrades; "polling" alone shows whether a proxy keeps every
        # request of a session on the process that holds it (docs/deployment.md).
        self.transports = ["websocket"]
        self.sio = socketio.AsyncClient(reconnection=False)
        self.events: list[tuple[str, Any]] = []
        self.times: list[float] = []  # time.monotonic() of each event, for latencies
        self.thread_id: str | None = None
        self.session_id: str | None = None
        self.last_sent: str | None = None  # the id of the last user message sent
        self.last_reply: dict[str, Any] | None = None  # the step of the last reply ask() got
        self._changed = asyncio.Event()
        self.sio.on("*", self._record)

    async def _record(self, event: str, data: Any = None) -> None:
        self.events.append((event, data))
        self.times.append(time.monotonic())
        if event == "first_interaction":
            self.thread_id = data["thread_id"]
        self._changed.set()

    async def wait_for(self, event: str, after: int = 0, timeout_s: float = WAIT_S) -> int:
        """Index of the first `event` at or after position `after` (at most `timeout_s` seconds)."""
        async with asyncio.timeout(timeout_s):
            while True:
                for i in range(after, len(self.events)):
                    if self.events[i][0] == event:
                        return i
                self._changed.clear()
                await self._changed.wait()

    async def connect(self, resume: str | None = None) -> None:
        cookie = "; ".join(f"{k}={v}" for k, v in self.http.cookies.items()) if self.http else ""
        self.session_id = str(uuid.uuid4())  # the page sends it with HTTP calls about the session (feedback)
        auth: dict[str, Any] = {"sessionId": self.session_id, "clientType": "webapp", "userEnv": "{}"}
        if resume:
            auth["threadId"] = resume
        # the chat's language comes from the socket's Accept-Language header, as a browser's does
        headers = {"Cookie": cookie, "Accept-Language": self.language}
        await self.sio.connect(
            self.url, socketio_path="/ws/socket.io", transports=self.transports, headers=headers, auth=auth
        )
        start = len(self.events)
        await self.sio.emit("connection_successful")
        # a new chat runs on_chat_start (task_start ... task_end)
        if resume:  # on_chat_resume runs, then the thread is sent to the page
            await self.wait_for("resume_thread", start)
            self.thread_id = resume
        else:
            await self.wait_for("task_end", await self.wait_for("task_start", start))

    def _user_message(self, text: str, message_id: str | None = None) -> dict[str, Any]:
        return {
            "id": message_id or str(uuid.uuid4()),
            "threadId": self.thread_id or "",
            "type": "user_message",
            "name": "User",
            "output": text,
            "createdAt": None,
        }

    async def send(self, text: str, files: list[dict[str, str]] | None = None) -> str:
        """Send a user message without waiting for anything (with `files`: the references of files uploaded to the
        session, as the page attaches them); returns the message's id."""
        message = self._user_message(text)
        await self.sio.emit("client_message", {"message": message, "fileReferences": files})
        return str(message["id"])

    async def ask(self, text: str, files: list[dict[str, str]] | None = None) -> str:
        """Send a user message and return the assistant's reply (the app's own notices excluded)."""
        start = len(self.events)
        self.last_sent = await self.send(text, files)
        await self.wait_for("task_end", await self.wait_for("task_start", start))
        if self.thread_id is None:  # the first message creates the thread (announced on its own schedule)
            await self.wait_for("first_interaction", start)
        steps = self.reply_steps(start)
        self.last_reply = steps[-1] if steps else None
        return str(steps[-1]["output"]) if steps else ""

    async def edit(self, message_id: str, text: str) -> None:
        """Send what the page's edit button sends for message `message_id`; returns when the app has handled it
        (a call: socket.io acknowledges once Chainlit's handler, and the on_message it may run, returned)."""
        await self.sio.call("edit_message", {"message": self._user_message(text, message_id)}, timeout=WAIT_S)

    def replies(self, start: int = 0) -> list[str]:
        """The last text of each assistant reply since event `start` (the app's own notices excluded)."""
        return [str(data["output"]) for data in self.reply_steps(start)]

    def reply_steps(self, start: int = 0) -> list[dict[str, Any]]:
        """The last state of each assistant reply's step (output, metadata...) since event `start`, notices excluded."""
        last: dict[str, dict[str, Any]] = {}
        for event, data in self.events[start:]:
            if (
                event in ("new_message", "update_message")
                and isinstance(data, dict)
                and data.get("type") == "assistant_message"
                and data.get("name") != "system"
            ):
                last[data["id"]] = data
        return list(last.values())

    async def change_settings(self, values: dict[str, Any]) -> None:
        """Move settings in the panel (waits until the app has applied them)."""
        await self.sio.call("chat_settings_change", values, timeout=30)

    def settings_shown(self) -> dict[str, Any]:
        """The initial values of the settings panel the app sent last."""
        panels = [data for event, data in self.events if event == "chat_settings"]
        return {w["id"]: w.get("initial", w.get("initial_value")) for w in panels[-1]} if panels else {}

    def notices(self, start: int = 0) -> list[str]:
        """Last texts of the app's own notices (author "system") since event `start` (a notice may be updated)."""
        last: dict[str, str] = {}
        for event, data in self.events[start:]:
            if event in ("new_message", "update_message") and isinstance(data, dict) and data.get("name") == "system":
                last[data["id"]] = str(data["output"])
        return list(last.values())

    async def close(self) -> None:
        await self.sio.disconnect()
