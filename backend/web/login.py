"""Chainlit's login token: whose it is (the workshop, the key page and the page's status line ask)."""

from __future__ import annotations

from chainlit.auth import decode_jwt, get_token_from_cookies
from fastapi import Request


def token_user(token: str) -> str | None:
    """The user name a Chainlit login token is for, if it is a valid one."""
    try:
        return str(decode_jwt(token).identifier)
    except Exception:  # expired, tampered with, or signed with another secret: not logged in
        return None


def login_user(request: Request) -> str | None:
    """The user name in the request's Chainlit login token (its cookie, or a Bearer header), if it holds a valid one."""
    token = get_token_from_cookies(request.cookies)
    header = request.headers.get("authorization", "")
    if not token and header.lower().startswith("bearer "):
        token = header[7:].strip()
    return token_user(token) if token else None
