"""Logging set-up for the app process and the commands."""

from __future__ import annotations

import logging
import os

# HTTP libraries that log every request at INFO: a tune or an answer check makes hundreds (the engine's /health while
# it starts, every measured reply), which buried the commands' own progress lines on the console.
NOISY_HTTP = ("httpx", "httpx2", "httpcore", "openai")


def quiet_http_libraries() -> None:
    """Show the HTTP libraries' warnings and errors only."""
    for noisy in NOISY_HTTP:
        logging.getLogger(noisy).setLevel(logging.WARNING)


def setup_logging() -> None:
    """Log our modules at INFO (ERNIE_LOG_LEVEL overrides); keep chatty HTTP libraries quiet."""
    level = os.environ.get("ERNIE_LOG_LEVEL", "INFO").upper()
    logging.getLogger("backend").setLevel(level)
    logging.getLogger("app").setLevel(level)
    quiet_http_libraries()
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def plain_messages(level: int) -> None:
    """The commands that show their progress as plain log lines: every logger at LEVEL, the HTTP libraries quiet."""
    logging.basicConfig(level=level, format="%(message)s")
    quiet_http_libraries()
