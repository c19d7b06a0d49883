"""The chat workload against the real llama-server serving the offline demo GGUF, started by the app's supervisor:
the engine's own usage counts say every reply ran to its drawn length and every history grew."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from backend.benchmarks.chat_workload import ChatShape, conversations, run_chat_level
from backend.chat.service import ChatService
from backend.config import load_config
from backend.engines.llamacpp import DEFAULT_PREFIX

pytestmark = pytest.mark.integration

SHAPE = ChatShape(turns=2, message_tokens=(10, 20), reply_tokens=(8, 16), seed=5)
USERS, TURNS = 2, 4
READY_S = 120.0


@pytest_asyncio.fixture(scope="module")
async def demo_llama(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ChatService]:
    """llama.cpp serving the demo GGUF as it ships (hub out of reach, no local copy)."""
    if not (DEFAULT_PREFIX / "bin" / "llama-server").is_file():
        pytest.fail(f"{DEFAULT_PREFIX / 'bin' / 'llama-server'} is missing: make setup builds it")
    root: Path = tmp_path_factory.mktemp("chat-workload")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_HOME", str(root / "hf-home"))
        cfg = load_config(
            environ={
                "ERNIE_ENGINE__NAME": "llama.cpp",
                "ERNIE_MODEL__ID": "baidu/ERNIE-4.5-0.3B-PT",
                "ERNIE_SERVER__PORT": "0",
                "ERNIE_PATHS__DATA_DIR": str(root / "data"),
                "ERNIE_PATHS__CACHE_DIR": str(root / "cache"),
                "ERNIE_LLAMACPP__N_CTX": "2048",
                "ERNIE_LLAMACPP__PARALLEL": str(USERS),
                "ERNIE_TIMEOUTS__STARTUP_S": str(READY_S),
                # The answer check is tested with this engine elsewhere (test_llamacpp_engine.py); off here, so
                # that this test stays short.
                "ERNIE_CANARY__ENABLED": "false",
            }
        )
        service = ChatService.from_config(cfg)
        service.start()
        try:
            if not await service.supervisor.wait_ready(READY_S):
                pytest.fail(f"llama.cpp not ready: {service.supervisor.status}")
            yield service
        finally:
            await service.stop()


async def test_replies_run_to_their_drawn_length_and_histories_grow(demo_llama: ChatService) -> None:
    ep = demo_llama.endpoint
    level = await run_chat_level(ep.base_url, ep.api_key, ep.model, USERS, TURNS, SHAPE, timeout_s=60)
    assert all(t.success for t in level.turns), [t.error for t in level.turns if not t.success]
    chats = conversations(SHAPE, TURNS)
    assert [(t.conversation, t.turn) for t in level.turns] == [(c, n) for c in range(2) for n in range(2)]
    for t in level.turns:
        assert t.output_tokens == chats[t.conversation].turns[t.turn].reply_tokens, t
        assert t.first_text_s is not None and t.first_text_s > 0
    for conv in range(2):
        first, second = (t for t in level.turns if t.conversation == conv)
        assert second.prompt_tokens > first.prompt_tokens + first.output_tokens, (first, second)
    summary = level.summary()
    assert (summary["users"], summary["turns"], summary["errors"]) == (USERS, TURNS, 0)
