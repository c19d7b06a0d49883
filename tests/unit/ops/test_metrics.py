"""The app's Prometheus metrics and the /metrics, /metrics/engine and /healthz endpoints."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from backend.chat.client import StreamStats
from backend.chat.service import ChatService
from backend.chat.turn import Done
from backend.config import AppConfig
from backend.errors import BackendError, PromptTooLongError
from backend.ops.metrics import AppMetrics, error_kind
from backend.prompts.schema import Reason
from backend.serving.supervisor import State, Status
from backend.web import routes

MakeConfig = Callable[..., AppConfig]


def samples(metrics: AppMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.exposition().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(metrics: AppMetrics, name: str, **labels: str) -> float:
    return samples(metrics)[(name, tuple(sorted(labels.items())))]


def test_backend_state_and_restarts() -> None:
    m = AppMetrics()
    m.observe_status(Status(state=State.STARTING))
    assert value(m, "ernie_backend_state", ernie_backend_state="starting") == 1
    assert value(m, "ernie_backend_ready") == 0
    m.observe_status(Status(state=State.READY, restarts=0))
    m.observe_status(Status(state=State.RESTARTING, restarts=2))
    m.observe_status(Status(state=State.READY, restarts=2))  # the same restarts are not counted twice
    assert value(m, "ernie_backend_state", ernie_backend_state="ready") == 1
    assert value(m, "ernie_backend_state", ernie_backend_state="restarting") == 0
    assert value(m, "ernie_backend_ready") == 1
    assert value(m, "ernie_backend_restarts_total") == 2


def test_active_chats_count_sessions_once() -> None:
    m = AppMetrics()
    m.chat_started("a")
    m.chat_started("b")
    m.chat_started("b")
    assert value(m, "ernie_active_chats") == 2
    m.chat_ended("a")
    m.chat_ended("a")
    m.chat_ended("unknown")
    assert value(m, "ernie_active_chats") == 1


def test_feedback_by_rating_and_comment() -> None:
    m = AppMetrics()
    m.feedback_given(1, None)
    m.feedback_given(1, "  ")
    m.feedback_given(0, "too long")
    assert value(m, "ernie_feedback_total", rating="up", comment="no") == 2
    assert value(m, "ernie_feedback_total", rating="down", comment="yes") == 1


def test_replies_timings_and_outcomes() -> None:
    m = AppMetrics()
    ok = StreamStats(started=100.0, first_token=100.5, finished=102.0, completion_tokens=10)
    m.reply_finished(ok)
    m.reply_finished(StreamStats(started=0.0, first_token=1.0, finished=1.5, completion_tokens=3), "stopped")
    m.reply_finished(
        StreamStats(started=0.0, finished=0.1), "failed", BackendError("The engine refused the request: x")
    )
    assert value(m, "ernie_reply_ttft_seconds_sum") == pytest.approx(1.5)
    assert value(m, "ernie_reply_ttft_seconds_count") == 2
    assert value(m, "ernie_reply_seconds_sum") == pytest.approx(3.5)
    assert value(m, "ernie_reply_ttft_seconds_bucket", le="0.5") == 1
    assert value(m, "ernie_reply_tokens_total") == 13
    assert value(m, "ernie_replies_total", outcome="ok") == 1
    assert value(m, "ernie_replies_total", outcome="stopped") == 1
    assert value(m, "ernie_replies_total", outcome="error") == 1
    assert value(m, "ernie_errors_total", kind="backend") == 1


def test_a_chat_turn_is_recorded_once_as_a_reply_and_as_a_chat_request() -> None:
    """turn_finished is the one record of a chat turn: each of its counters goes up once per turn, with its tokens."""
    m = AppMetrics()
    finished = Done("x", "default", Reason("default"), "q", stats=StreamStats(started=0.0, first_token=0.5,
                    finished=1.0, prompt_tokens=12, completion_tokens=30), prompt_tokens=99)  # fmt: skip
    stopped = Done("one", "default", Reason("default"), "q", "stopped", stats=StreamStats(chunks=2), prompt_tokens=7)
    failed = Done("", "default", Reason("default"), "q", "failed", BackendError.of("backend.timeout"), StreamStats())
    for done in (finished, stopped, failed):
        m.turn_finished(done)
    assert value(m, "ernie_replies_total", outcome="ok") == 1
    assert value(m, "ernie_replies_total", outcome="stopped") == 1
    assert value(m, "ernie_replies_total", outcome="error") == 1
    assert value(m, "ernie_errors_total", kind="timeout") == 1
    assert value(m, "ernie_reply_seconds_count") == 1
    assert value(m, "ernie_reply_tokens_total") == 30
    for outcome in ("finished", "stopped", "failed"):
        assert value(m, "ernie_requests_total", route="chat", outcome=outcome) == 1
    assert value(m, "ernie_usage_tokens_total", route="chat", kind="prompt") == 12 + 7  # the engine's, else the count
    assert value(m, "ernie_usage_tokens_total", route="chat", kind="reply") == 30 + 2  # a stopped reply: its chunks


def test_error_kinds() -> None:
    timeout = BackendError.of("backend.timeout")
    assert error_kind(timeout) == "timeout"
    assert error_kind(BackendError.of("backend.broken")) == "connection"
    assert error_kind(BackendError.of("backend.auth")) == "backend"
    assert error_kind(PromptTooLongError("too long")) == "too_long"
    assert error_kind(RuntimeError("?")) == "internal"
    assert error_kind("unavailable") == "unavailable"
    m = AppMetrics()
    assert m.record_error(timeout) == "timeout"
    assert value(m, "ernie_errors_total", kind="timeout") == 1


def test_endpoints(make_config: MakeConfig) -> None:
    service = ChatService.from_config(make_config())  # never started: the engine is down
    m = AppMetrics()
    m.watch(service.supervisor)
    m.chat_started("s1")
    app = FastAPI()
    routes.install_routes(service, app, metrics=m)
    with TestClient(app, base_url="http://127.0.0.1:8501", client=("127.0.0.1", 50000)) as http:  # this machine
        resp = http.get("/metrics")
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/plain")
        assert 'ernie_backend_state{ernie_backend_state="stopped"} 1.0' in resp.text
        assert "ernie_active_chats 1.0" in resp.text
        assert "# TYPE ernie_reply_ttft_seconds histogram" in resp.text
        engine = http.get("/metrics/engine")
        assert engine.status_code == 503
        assert engine.text.startswith("# engine metrics unavailable: ConnectError")
        health = http.get("/healthz")
        assert health.status_code == 503 and health.json()["engine"]["state"] == "stopped"
        alive = http.get("/livez")  # the process serves pages while its engine is down
        assert alive.status_code == 200 and alive.json() == {"status": "alive"}
    paths = [getattr(r, "path", None) for r in app.router.routes]
    assert paths[:4] == ["/healthz", "/livez", "/metrics", "/metrics/engine"]


@pytest.mark.parametrize("setting", ["local", "token"])
def test_metrics_and_health_detail_are_for_this_machine(make_config: MakeConfig, setting: str) -> None:
    """web.monitoring: another machine gets /livez and /healthz's status, not the metrics nor the health detail,
    unless it sends web.monitoring_token."""
    service = ChatService.from_config(make_config(web__monitoring_token="s3cret-token"))
    app = FastAPI()
    routes.install_routes(service, app, metrics=AppMetrics())
    with TestClient(app, base_url="http://chat.example.com", client=("203.0.113.9", 50000)) as http:
        token = {"Authorization": "Bearer s3cret-token"} if setting == "token" else {}
        metrics, engine = http.get("/metrics", headers=token), http.get("/metrics/engine", headers=token)
        health, alive = http.get("/healthz", headers=token), http.get("/livez")
    assert alive.status_code == 200 and health.status_code == 503, "the status answers everyone"
    if setting == "token":
        assert (
            metrics.status_code == 200 and engine.status_code == 503 and health.json()["engine"]["state"] == "stopped"
        )
        return
    assert health.json() == {"status": "degraded"}, "no engine address, pid or error for another machine"
    for refused in (metrics, engine):
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "web.monitoring"
        assert "203.0.113.9" in refused.json()["error"]["message"]
    with TestClient(app, base_url="http://chat.example.com", client=("203.0.113.9", 50000)) as http:
        wrong = http.get("/metrics", headers={"Authorization": "Bearer wrong"})
    assert wrong.status_code == 403
