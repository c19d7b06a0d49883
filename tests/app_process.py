"""Starting the real app (`chainlit run app.py`) as a child process for tests, and watching processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from backend.config import ROOT
from backend.ops.prometheus_text import sample_totals
from backend.serving.process import free_port

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

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 300) -> None:
        """Wait until the app answers and its engine is ready; fail at once if the app died."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the app exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            try:
                if self.health().get("status") == "ok":
                    return
            except OSError:
                pass
            time.sleep(1)
        raise AssertionError("the app's engine did not become ready:\n" + self.log_text()[-3000:])

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
    port = port or free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith(("ERNIE_", "CHAINLIT_AUTH"))}
    full.update({"HF_HUB_OFFLINE": "1", **env})
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


POSTGRES_URL = os.environ.get("ERNIE_TEST_POSTGRES_URL", "")


def reset_postgres() -> None:
    """Empty the test PostgreSQL database (ERNIE_TEST_POSTGRES_URL), when there is one."""
    if not POSTGRES_URL:
        return
    import asyncio

    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    from backend.storage.schema import TABLES, VERSION_TABLE

    async def drop() -> None:
        engine = create_async_engine(POSTGRES_URL)
        async with engine.begin() as conn:
            for table in [*reversed(TABLES), VERSION_TABLE]:
                await conn.execute(text(f"DROP TABLE IF EXISTS {table} CASCADE"))
        await engine.dispose()

    asyncio.run(drop())


def login_env(data: Path, model: Path, users_file: Path) -> dict[str, str]:
    """ERNIE_* settings for an app with login and saved conversations, serving `model` with short replies.

    The conversations go to SQLite in `data`, or to PostgreSQL when ERNIE_TEST_POSTGRES_URL is set."""
    cache = os.environ.get("ERNIE_PATHS__CACHE_DIR")
    canary = os.environ.get("ERNIE_CANARY__DIR")
    reset_postgres()
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
        **({"ERNIE_STORAGE__DATABASE_URL": POSTGRES_URL} if POSTGRES_URL else {}),
    }
