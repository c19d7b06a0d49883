"""A client for the running app's own HTTP and websocket API (what the browser uses): log in, chat, resume.
The websocket client itself is the load tool's (backend/benchmarks/chat_socket.py)."""

from __future__ import annotations

from typing import Any

import httpx

from backend.benchmarks.chat_socket import WAIT_S, ChatSocket
from backend.benchmarks.chat_socket import reply_finished as rendered_finished
from tests.waiting import until

__all__ = ["WAIT_S", "ChatSocket", "login", "rendered_finished", "saved_thread", "upload"]


async def login(url: str, name: str, password: str) -> httpx.AsyncClient:
    """An HTTP client holding the session cookie of `name` (raises on a refused login)."""
    http = httpx.AsyncClient(base_url=url, trust_env=False, timeout=30)
    response = await http.post("/login", data={"username": name, "password": password})
    response.raise_for_status()
    return http


async def upload(http: httpx.AsyncClient, chat: ChatSocket, name: str, data: bytes, mime: str) -> dict[str, str]:
    """Upload a file to the chat's session as the page's attach button does; the reference a message sends with it."""
    files = {"file": (name, data, mime)}
    response = await http.post("/project/file", params={"session_id": chat.session_id}, files=files)
    response.raise_for_status()
    return {"id": str(response.json()["id"])}


async def saved_thread(http: httpx.AsyncClient, tid: str) -> dict[str, Any]:
    """The thread as saved, once its reply is: Chainlit writes the steps in the background, after the page has them."""

    async def saved() -> dict[str, Any] | None:
        thread: dict[str, Any] = (await http.get(f"/project/thread/{tid}")).json()
        return thread if {"user_message", "assistant_message"} <= {s["type"] for s in thread.get("steps", [])} else None

    return await until(saved, f"thread {tid}'s steps saved", interval=0.2)
