"""Chainlit's login token (backend/web/login.py): whose it is, from its cookie or a Bearer header; a forged one is
nobody's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from starlette.requests import Request

from backend.web.login import login_user


def test_the_login_token_is_read_from_chainlits_cookie_or_a_bearer_header(monkeypatch: pytest.MonkeyPatch) -> None:
    import jwt

    monkeypatch.setenv("CHAINLIT_AUTH_SECRET", "s" * 48)
    claims = {"identifier": "ed", "metadata": {}, "exp": datetime.now(UTC) + timedelta(hours=1)}
    token = jwt.encode(claims, "s" * 48, algorithm="HS256")
    forged = jwt.encode(claims, "x" * 48, algorithm="HS256")

    def with_headers(*headers: tuple[str, str]) -> Request:
        raw = [(k.encode(), v.encode()) for k, v in headers]
        return Request({"type": "http", "client": ("10.0.0.5", 1), "headers": raw, "method": "GET", "path": "/"})

    assert login_user(with_headers(("cookie", f"access_token={token}"))) == "ed"
    assert login_user(with_headers(("authorization", f"Bearer {token}"))) == "ed"
    assert login_user(with_headers(("cookie", f"access_token={forged}"))) is None
    assert login_user(with_headers()) is None
