"""A model's text may hold raw Unicode line breaks (U+2028, U+0085) inside one JSON event; the stream must not
cut the event there (it did: "Unterminated string" under load, about 1 reply in 900)."""

from __future__ import annotations

import json

import httpx2 as httpx

from backend.chat.client import event_lines


async def test_an_event_with_unicode_line_breaks_stays_whole() -> None:
    event = {"choices": [{"delta": {"content": "a\u2028b\x85c\u2029d\x1ce"}}]}
    body = ("data: " + json.dumps(event, ensure_ascii=False) + "\r\n\r\ndata: [DONE]\n\n").encode()
    lines = [line async for line in event_lines(httpx.Response(200, content=body))]
    data = [line for line in lines if line.startswith("data:")]
    assert data == ["data: " + json.dumps(event, ensure_ascii=False), "data: [DONE]"]
    assert json.loads(data[0][5:])["choices"][0]["delta"]["content"] == "a\u2028b\x85c\u2029d\x1ce"
