"""The line in front of the engine, against the real app and engine (llama.cpp serving the offline demo model).

With one place at the engine and one in line (llamacpp.parallel 1, admission.queue_max 1), ten requests at once get
exactly two 200s and eight 503s with Retry-After (SGLang's own test of its bound, the same way); a restart (SIGTERM)
lets the reply in flight finish, tells newcomers the service is restarting, and then stops the app."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.app_process import RunningApp, start_app
from tests.waiting import until

pytestmark = pytest.mark.integration

OFFLINE = {"HF_ENDPOINT": "http://127.0.0.1:9"}  # the hub out of reach: the demo model answers


def app_with_one_place(data: Path, **overrides: str) -> RunningApp:
    return start_app(
        data, engine__name="llama.cpp", llamacpp__parallel="1", admission__queue_max="1", api__enabled="true",
        # the per-user quota (2 replies at once) would refuse the eight first (429): the line is what is tested here
        api__quotas__concurrent="20", api__quotas__requests_per_minute="100",
        HF_HOME=str(data / "hf"), **OFFLINE, **overrides,
    )  # fmt: skip


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApp]:
    running = app_with_one_place(tmp_path_factory.mktemp("admission"))
    try:
        running.wait_ready()
        yield running
    finally:
        running.kill()


def body(tokens: int) -> dict[str, object]:
    return {
        "model": "auto",
        "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}],
        "stream": True,
        "max_tokens": tokens,
        "ignore_eos": True,
    }


async def streamed(http: httpx.AsyncClient, tokens: int) -> tuple[int, dict[str, str], str]:
    """(status, headers, the reply's text or the error body) of one streamed request."""
    async with http.stream("POST", "/v1/chat/completions", json=body(tokens)) as resp:
        if resp.status_code != 200:
            return resp.status_code, dict(resp.headers), (await resp.aread()).decode()
        text = []
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"]
                if delta and (piece := delta[0].get("delta", {}).get("content")):
                    text.append(piece)
        return 200, dict(resp.headers), "".join(text)


async def test_one_place_and_one_in_line_take_two_of_ten_and_the_rest_are_told_busy(app: RunningApp) -> None:
    async with httpx.AsyncClient(base_url=app.url, timeout=300) as http:
        results = await asyncio.gather(*(streamed(http, 96) for _ in range(10)))
    statuses = sorted(status for status, _, _ in results)
    assert statuses == [200, 200] + [503] * 8, statuses
    for status, headers, text in results:
        if status == 503:
            assert int(headers["retry-after"]) >= 1, headers
            error = json.loads(text)["error"]
            assert error["code"] == "admission.full" and "try again" in error["message"].lower(), error
        else:
            assert text, "an admitted request got its reply"
    line = app.health()["line"]
    assert line["places"] == 1 and line["running"] == 0 and line["waiting"] == 0 and line["refused"] >= 8, line


async def test_a_restart_lets_the_reply_in_flight_finish_and_tells_newcomers(tmp_path: Path) -> None:
    app = app_with_one_place(tmp_path / "drain", admission__drain_s="60", admission__restart_s="42")
    try:
        app.wait_ready()
        async with httpx.AsyncClient(base_url=app.url, timeout=300) as http:
            in_flight = asyncio.ensure_future(streamed(http, 160))
            await until(lambda: app.health()["line"]["running"] >= 1, "the reply being written")
            app.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(1.0)
            status, headers, text = await streamed(http, 8)
            assert status == 503 and headers["retry-after"] == "42", (status, headers, text)
            assert json.loads(text)["error"]["code"] == "admission.restarting"
            assert (await http.get("/livez")).status_code == 503, "a proxy sends new sessions elsewhere"
            status, _, reply = await in_flight
            assert status == 200 and reply, "the reply in flight finished"
        app.proc.wait(timeout=60)  # then the app stopped by itself
        log = app.log_text()
        assert "Draining for a restart: 1 reply in flight" in log and "Drained in" in log, log[-3000:]
    finally:
        app.kill()
