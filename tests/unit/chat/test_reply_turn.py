"""One chat turn end to end through the real wiring: ChatService.from_config with engine.name external, talking to
the stand-in engine process (tests/stub_engine.py) over HTTP: refused input, a streamed reply, a broken one, and
a message that has to wait for the engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from pathlib import Path

import pytest

from backend.chat import service as service_module
from backend.chat.service import ChatService, Recorder
from backend.chat.turn import ChatSession, Done, EngineWait, Event, Refused, Started, Text
from backend.config import AppConfig
from backend.errors import BackendError, EngineStartError
from backend.ops.metrics import AppMetrics
from backend.serving.process import free_port
from backend.serving.supervisor import State
from tests.conftest import MakeConfig, StartStub
from tests.deadlines import WAIT_S
from tests.unit.chat.test_quota import FakeQuotas

SERVED = "stub-model"
REPLY = "Hello from the stub engine."


class ListRecorder:
    """Keeps what the service records."""

    def __init__(self) -> None:
        self.errors: list[BaseException | str] = []
        self.finished: list[Done] = []
        self.requests: list[tuple[str, str, int, int]] = []

    def record_error(self, error: BaseException | str) -> str:
        self.errors.append(error)
        return ""

    def turn_finished(self, done: Done) -> None:
        self.finished.append(done)

    def request_finished(self, route: str, outcome: str, prompt_tokens: int, reply_tokens: int) -> None:
        self.requests.append((route, outcome, prompt_tokens, reply_tokens))


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    folder = tmp_path / "prompts"
    folder.mkdir()
    (folder / "default.yaml").write_text('name: default\nuser: "{input}"\n')
    return folder


@pytest.fixture
def config(make_config: MakeConfig, prompts: Path) -> Callable[..., AppConfig]:
    def make(root: str, **overrides: object) -> AppConfig:
        settings: dict[str, object] = {
            "engine__name": "external",
            "server__base_url": root + "/v1",
            "model__served_name": SERVED,
            "paths__prompts_dir": prompts,
            "timeouts__startup_s": 180,  # a stub starts in about a second; a busy machine takes longer
            "timeouts__health_interval_s": 0.5,
            "timeouts__health_timeout_s": 1,
            "restart__backoff_initial_s": 0.1,
            "restart__backoff_max_s": 0.2,
            **overrides,
        }
        return make_config(**settings)

    return make


@asynccontextmanager
async def running(cfg: AppConfig, recorder: Recorder, wait: bool = True) -> AsyncIterator[ChatService]:
    svc = ChatService.from_config(cfg, recorder=recorder)
    svc.start()
    try:
        if wait:
            assert await svc.supervisor.wait_ready(WAIT_S), svc.supervisor.status
        yield svc
    finally:
        await svc.stop()


async def turn(svc: ChatService, session: ChatSession, text: str) -> list[Event]:
    return [event async for event in svc.reply(session, text)]


def split(events: list[Event]) -> tuple[list[Text], Done]:
    """The reply's Text events and its one Done, which comes last (after the one Started that begins the reply)."""
    assert events and isinstance(events[-1], Done), events
    assert isinstance(events[0], Started) and [e for e in events if isinstance(e, Started)] == events[:1], events
    assert all(isinstance(e, Text) for e in events[1:-1]), events
    return [e for e in events[1:-1] if isinstance(e, Text)], events[-1]


# ----- refused before anything is sent ---------------------------------------------------------------------
@pytest.mark.parametrize("text", ["", "   \n\t ", "\x00\x07\x1b"], ids=["empty", "blank", "control-chars"])
async def test_an_empty_message_is_refused_and_never_reaches_the_engine(
    start_stub: StartStub, config: Callable[..., AppConfig], text: str
) -> None:
    stub = start_stub()
    recorder = ListRecorder()
    async with running(config(stub.url), recorder) as svc:
        session = svc.new_session()
        events = await turn(svc, session, text)
    assert len(events) == 1 and isinstance(events[0], Refused), events
    assert events[0].error.code == "input.empty"
    assert stub.chat_requests() == 0
    assert session.history == [] and recorder.finished == []


async def test_a_message_over_the_size_limit_is_refused(
    start_stub: StartStub, config: Callable[..., AppConfig]
) -> None:
    stub = start_stub()
    async with running(config(stub.url, chat__max_input_chars=100), ListRecorder()) as svc:
        events = await turn(svc, svc.new_session(), "x" * 101)
    assert [type(e) for e in events] == [Refused]
    assert isinstance(events[0], Refused) and events[0].error.code == "input.too_large"
    assert stub.chat_requests() == 0


# ----- a reply -----------------------------------------------------------------------------------------------
async def test_a_reply_streams_then_finishes_and_is_recorded(
    start_stub: StartStub, config: Callable[..., AppConfig]
) -> None:
    stub = start_stub()
    recorder = ListRecorder()
    async with running(config(stub.url), recorder) as svc:
        session = svc.new_session()
        texts, done = split(await turn(svc, session, "Hello there"))
        assert texts, "the reply is streamed as Text events before Done"
        assert done.ending == "finished" and done.error is None
        assert done.text == "".join(t.text for t in texts) == REPLY
        assert (done.template, done.user_text) == ("default", "Hello there")
        assert session.history == [
            {"role": "user", "content": "Hello there"},
            {"role": "assistant", "content": REPLY},
        ]
        assert recorder.finished == [done] and recorder.errors == []
        stats = done.stats
        assert stats is not None and stats.finish_reason == "stop" and stats.completion_tokens == len(REPLY.split())
        assert stub.chat_requests() == 1

        _, again = split(await turn(svc, session, "And again"))  # the next turn adds to the history
    assert again.ending == "finished" and len(session.history) == 4
    assert stub.chat_requests() == 2


async def test_a_reply_broken_mid_stream_is_interrupted_and_keeps_what_arrived(
    start_stub: StartStub, config: Callable[..., AppConfig]
) -> None:
    stub = start_stub("--break-after", "2")  # "Hello from " arrives, then the engine goes away
    recorder = ListRecorder()
    async with running(config(stub.url), recorder) as svc:
        session = svc.new_session()
        texts, done = split(await turn(svc, session, "Hello there"))
    assert done.ending == "interrupted"
    assert isinstance(done.error, BackendError) and done.error.code == "backend.broken_external"  # not ours to restart
    assert texts and done.text == "".join(t.text for t in texts)
    assert "Hello from ".startswith(done.text), done.text
    assert stub.chat_requests() == 1, "part of the reply was shown: it is not asked again"
    assert recorder.finished == [done]
    # What the user saw stays in the conversation (as before the reorganisation: app.py kept partial replies).
    assert session.history == [
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": done.text},
    ]


async def test_a_reply_that_breaks_before_any_text_fails_after_the_retries_and_adds_no_turn(
    start_stub: StartStub, config: Callable[..., AppConfig]
) -> None:
    stub = start_stub("--break-after", "0")
    recorder = ListRecorder()
    async with running(config(stub.url, restart__request_retries=1), recorder) as svc:
        session = svc.new_session()
        texts, done = split(await turn(svc, session, "Hello there"))
    assert texts == [] and done.text == ""
    assert done.ending == "failed"
    assert isinstance(done.error, BackendError) and done.error.code == "backend.broken_external"  # not ours to restart
    assert stub.chat_requests() == 2, "restart.request_retries=1: one retry before the first token"
    assert session.history == []
    assert recorder.finished == [done]


async def test_a_stop_mid_reply_ends_it_as_stopped_and_keeps_what_arrived(
    start_stub: StartStub, config: Callable[..., AppConfig]
) -> None:
    """The stop button as the app presses it (backend.chat.live): the task that runs the turn is cancelled while the
    engine still decodes; the turn ends with its Done, the text that arrived kept."""
    stub = start_stub("--reply", "one two three four five six seven eight", "--word-s", "0.3")
    recorder = ListRecorder()
    async with running(config(stub.url, chat__stream_flush_ms=0), recorder) as svc:
        session = svc.new_session()
        events: list[Event] = []
        first_text = asyncio.Event()

        async def run_turn() -> None:  # as LiveReply._run: the task awaits nothing but the turn
            async with aclosing(svc.reply(session, "Hello there")) as turn:
                async for event in turn:
                    events.append(event)
                    if isinstance(event, Text):
                        first_text.set()

        task = asyncio.create_task(run_turn())
        await asyncio.wait_for(first_text.wait(), WAIT_S)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    done = events[-1]
    texts = "".join(e.text for e in events if isinstance(e, Text))
    assert isinstance(done, Done) and done.ending == "stopped" and done.error is None, done
    assert done.text == texts and texts.startswith("one") and "eight" not in texts, texts
    assert session.history == [
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": texts},
    ]
    assert recorder.finished == [done]


async def test_an_interrupted_reply_keeps_all_the_text_that_arrived(
    start_stub: StartStub, config: Callable[..., AppConfig]
) -> None:
    stub = start_stub("--break-after", "3")  # "Hello from the " arrives at once, then the connection drops
    async with running(config(stub.url, chat__stream_flush_ms=1000), ListRecorder()) as svc:
        _, done = split(await turn(svc, svc.new_session(), "Hello there"))
    assert done.ending == "interrupted"
    assert done.text == "Hello from the "


async def test_a_users_turn_within_their_quota_is_counted_once_in_the_metrics(
    start_stub: StartStub, config: Callable[..., AppConfig]
) -> None:
    """The page's turn (ChatService.answer: reply() within the user's quota) is recorded once: one reply, one chat
    request with its tokens, one quota place counted with the same tokens."""
    stub = start_stub()
    metrics = AppMetrics()
    quotas = FakeQuotas()
    async with running(config(stub.url), metrics) as svc:
        svc.quota.store = quotas
        _, done = split([e async for e in svc.answer("alice", svc.new_session(), "Hello there")])
    assert done.ending == "finished"
    prompt, reply = done.usage
    assert prompt and reply == len(REPLY.split())

    def counted(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, labels) or 0.0

    assert counted("ernie_requests_total", route="chat", outcome="finished") == 1
    assert sum(counted("ernie_replies_total", outcome=o) for o in ("ok", "stopped", "error")) == 1
    assert counted("ernie_replies_total", outcome="ok") == 1
    assert counted("ernie_reply_seconds_count") == 1
    assert counted("ernie_reply_tokens_total") == reply
    assert counted("ernie_usage_tokens_total", route="chat", kind="prompt") == prompt
    assert counted("ernie_usage_tokens_total", route="chat", kind="reply") == reply
    (lease,) = quotas.released
    assert quotas.counted == [True] and (lease.prompt_tokens, lease.reply_tokens) == (prompt, reply)


# ----- waiting for the engine ----------------------------------------------------------------------------
async def test_a_message_waits_for_a_starting_engine_then_gets_its_reply(
    start_stub: StartStub, config: Callable[..., AppConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_module, "WAIT_STEP_S", 0.2)
    stub = start_stub("--ready-after", "1.5")
    recorder = ListRecorder()
    async with running(config(stub.url), recorder, wait=False) as svc:
        session = svc.new_session()
        events = await turn(svc, session, "Hello there")
    waits = [e for e in events if isinstance(e, EngineWait)]
    assert [w.state for w in waits[:-1]] and {w.state for w in waits[:-1]} == {"starting"}, waits
    assert waits[-1].state == "ready"
    seconds = [w.elapsed_s for w in waits]
    assert seconds == sorted(seconds), (
        f"one clock: the ready notice's time is the last starting one's or more {seconds}"
    )
    assert events[: len(waits)] == waits, "every wait comes before the reply"
    _, done = split(events[len(waits) :])
    assert done.ending == "finished" and done.text == REPLY
    assert len(session.history) == 2 and recorder.errors == []


async def test_a_message_for_an_engine_that_never_comes_is_told_it_failed_and_the_next_one_asks_again(
    start_stub: StartStub, config: Callable[..., AppConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_module, "WAIT_STEP_S", 0.2)
    port = free_port()  # nothing listens there yet
    cfg = config(f"http://127.0.0.1:{port}", timeouts__startup_s=1, restart__max_attempts=1)
    recorder = ListRecorder()
    async with running(cfg, recorder, wait=False) as svc:
        session = svc.new_session()
        events = await turn(svc, session, "Hello there")
        assert events and all(isinstance(e, EngineWait) for e in events), events
        waits = [e for e in events if isinstance(e, EngineWait)]
        assert {w.state for w in waits[:-1]} <= {"starting", "restarting"}
        failed = waits[-1]
        assert failed.state == "failed"
        assert isinstance(failed.problem, EngineStartError) and failed.problem.code == "engine.not_ready"
        assert failed.problem.hint
        assert recorder.errors == ["unavailable"] and recorder.finished == [] and session.history == []
        assert svc.supervisor.status.state == State.FAILED

        await asyncio.to_thread(start_stub(port=port).wait_listening)  # the cause is fixed: a new round
        events = await turn(svc, session, "Hello again")
    waits = [e for e in events if isinstance(e, EngineWait)]
    assert waits and waits[-1].state == "ready"
    _, done = split(events[len(waits) :])
    assert done.ending == "finished" and done.text == REPLY
    assert session.history[0] == {"role": "user", "content": "Hello again"}
