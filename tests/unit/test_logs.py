"""The commands' console: their own progress lines, not a line per HTTP request of the libraries they use."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import logging
from backend.cli import _messages
_messages(logging.INFO)()
for name in ("httpx", "httpcore", "openai"):
    logging.getLogger(name).info("HTTP Request: GET http://127.0.0.1:1/health 503")
logging.getLogger("httpx").warning("a library's warning")
logging.getLogger("backend.tuning.tuner").info("Engine tune: starting llama.cpp q4_1 (1 of 3)")
"""


def test_a_command_prints_its_progress_and_not_each_http_request() -> None:
    """`python -m backend tune` printed ~640 "HTTP Request: ..." lines among its ~60 own (2026-12-07)."""
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True)
    lines = done.stderr.splitlines()
    assert "Engine tune: starting llama.cpp q4_1 (1 of 3)" in lines, lines
    assert "a library's warning" in lines, "the libraries' warnings still show"
    assert not [line for line in lines if "HTTP Request" in line], lines
