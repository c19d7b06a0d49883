"""A stand-in engine (tests/stub_engine.py) as a real child process on a free port, for the bench command."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from backend.config import ROOT

STUB = ROOT / "tests" / "stub_engine.py"
START_S = 30.0


@pytest.fixture
def stub_engine() -> Iterator[str]:
    """The stub's root URL once it answers /health; stopped afterwards."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(STUB), str(port), "ernie"], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_S
    try:
        while True:
            assert proc.poll() is None, f"the stub engine exited with {proc.returncode}"
            assert time.monotonic() < deadline, "the stub engine never answered /health"
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)  # polling: the next try, not a wait for something to happen
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
