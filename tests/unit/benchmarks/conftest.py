"""A stand-in engine (tests/stub_engine.py) as a real child process on a free port, for the bench command."""

from __future__ import annotations

import pytest

from tests.conftest import StartStub


@pytest.fixture
def stub_engine(start_stub: StartStub) -> str:
    """The stub's root URL once it listens (it answers at once); stopped afterwards."""
    stub = start_stub(model="ernie")
    stub.wait_listening()
    return stub.url
