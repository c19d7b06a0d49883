"""A client for the running app's own HTTP and websocket API (what the browser uses): log in, chat, resume."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import socketio

WAIT_S = 180  # a reply may wait for a (re)starting engine


async def login(url: str, name: str, password: str) -> httpx.AsyncClient:
    """An HTTP client holding the session cookie of `name` (raises on a refused login)."""
    http = httpx.AsyncClient(base_url=url, trust_env=False, timeout=30)
    response = await http.post("/login", data={"username": name, "password": password})
    response.raise_for_status()
    return http


class ChatSocket:
    """One chat session over Chainlit's socket.io endpoint."""

    def __init__(self, url: str, http: httpx.AsyncClient | None) -> None:
        self.url, self.http = url, http
        self.sio = socketio.AsyncClient(reconnection=False)
        self.events: list[tuple[str, Any]] = []
        self.thread_id: str | None = None
        self._changed = asyncio.Event()
        self.sio.on("*", self._record)

    async def _record(self, event: str, data: Any = None) -> None:
        self.events.append((event, data))
        if event == "first_interaction":
            self.thread_id = data["thread_id"]
        self._changed.set()

    async def wait_for(self, event: str, after: int = 0) -> int:
        """Index of the first `event` at or after position `after` (at most WAIT_S seconds)."""
        async with asyncio.timeout(WAIT_S):
            while True:
                for i in range(after, len(self.events)):
                    if self.events[i][0] == event:
                        return i
                self._changed.clear()
                await self._changed.wait()

    async def connect(self, resume: str | None = None) -> None:
        cookie = "; ".join(f"{k}={v}" for k, v in self.http.cookies.items()) if self.http else ""
        auth: dict[str, Any] = {"sessionId": str(uuid.uuid4()), "clientType": "webapp", "userEnv": "{}"}
        if resume:
            auth["threadId"] = resume
        await self.sio.connect(
            self.url, socketio_path="/ws/socket.io", transports=["websocket"], headers={"Cookie": cookie}, auth=auth
        )
        start = len(self.events)
        await self.sio.emit("connection_successful")
        # a new chat runs on_chat_start (task_start ... task_end)
        if resume:  # on_chat_resume runs, then the thread is sent to the page
            await self.wait_for("resume_thread", start)
            self.thread_id = resume
        else:
            await self.wait_for("task_end", await self.wait_for("task_start", start))

    async def ask(self, text: str) -> str:
        """Send a user message and return the assistant's reply (the app's own notices excluded)."""
        start = len(self.events)
        message = {
            "id": str(uuid.uuid4()),
            "threadId": self.thread_id or "",
            "type": "user_message",
            "name": "User",
            "output": text,
            "createdAt": None,
        }
        await self.sio.emit("client_message", {"message": message, "fileReferences": None})
        await self.wait_for("task_end", await self.wait_for("task_start", start))
        if self.thread_id is None:  # the first message creates the thread (announced on its own schedule)
            await self.wait_for("first_interaction", start)
        replies = [
            data
            for event, data in self.events[start:]
            if event in ("new_message", "update_message")
            and data.get("type") == "assistant_message"
            and data.get("name") != "system"
        ]
        return str(replies[-1]["output"]) if replies else ""

    async def change_settings(self, values: dict[str, Any]) -> None:
        """Move settings in the panel (waits until the app has applied them)."""
        await self.sio.call("chat_settings_change", values, timeout=30)

    def settings_shown(self) -> dict[str, Any]:
        """The initial values of the settings panel the app sent last."""
        panels = [data for event, data in self.events if event == "chat_settings"]
        return {w["id"]: w.get("initial", w.get("initial_value")) for w in panels[-1]} if panels else {}

    def notices(self) -> list[str]:
        """Texts of the app's own notices (author "system") so far."""
        return [
            str(d["output"])
            for e, d in self.events
            if e in ("new_message", "update_message") and isinstance(d, dict) and d.get("name") == "system"
        ]

    async def close(self) -> None:
        await self.sio.disconnect()
