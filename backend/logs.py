"""Logging set-up for the app process."""

from __future__ import annotations

import logging
import os


def setup_logging() -> None:
    """Log our modules at INFO (ERNIE_LOG_LEVEL overrides); keep chatty HTTP libraries quiet."""
    level = os.environ.get("ERNIE_LOG_LEVEL", "INFO").upper()
    logging.getLogger("backend").setLevel(level)
    logging.getLogger("app").setLevel(level)
    for noisy in ("httpx", "httpx2", "httpcore", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
