"""ChatService.build_request: the conversation fitted into the context window (oldest turns first, a shorter reply
for a long message, refused when nothing fits), sampling from config, template and the user's own changes, and
the template a message gets. The client is a fake that counts one token per character."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from backend.chat.client import Message, StreamStats
from backend.chat.context import estimate_tokens
from backend.chat.decision import COMMAND_REASON
from backend.chat.request import UserSettings
from backend.chat.service import MIN_REPLY_TOKENS, ChatService
from backend.chat.sources import Source, with_sources
from backend.chat.turn import ChatSession, Done, Notice, Refused, Started, Text
from backend.config import AppConfig, EngineFlags
from backend.errors import InvalidInputError, PromptTooLongError
from backend.prompts.schema import Reason
from backend.prompts.store import TemplateStore
from tests.conftest import MakeConfig


class FakeStream:
    """The pieces, then the finish; with `hold`, the stream waits for it after its first piece (an engine that
    still decodes while the app reads)."""

    def __init__(self, pieces: list[str], hold: asyncio.Event | None = None) -> None:
        self.pieces = pieces
        self.hold = hold
        self.stats = StreamStats()

    async def __aenter__(self) -> FakeStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def __aiter__(self) -> AsyncIterator[str]:
        for i, piece in enumerate(self.pieces):
            if i == 1 and self.hold is not None:
                await self.hold.wait()
            yield piece
        self.stats.finish_reason = "stop"


class CharClient:
    """One token per character of every message's content; a window of `window` tokens; replies "ok"."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.sent: list[tuple[list[Message], dict[str, Any]]] = []

    async def count_tokens(self, messages: list[Message]) -> int:
        return sum(len(m["content"]) for m in messages)

    def forget_templates(self) -> None:
        return None

    async def max_model_len(self) -> int:
        return self.window

    def stream(self, messages: list[Message], **sampling: Any) -> FakeStream:
        self.sent.append((messages, sampling))
        return FakeStream(["o", "k"])


class ReadySupervisor:
    """An engine that is serving the real model (not the demo)."""

    spec = None
    flags = EngineFlags()
    ready = True


def turn(i: int, size: int = 10) -> list[Message]:
    return [{"role": "user", "content": f"{i}" * size}, {"role": "assistant", "content": f"{i}" * size}]


def done_turn(text: str) -> Message:
    return {"role": "assistant", "content": text}


CREATIVE = """\
name: creative
keywords: [poem]
temperature: 1.3
top_p: 0.5
max_tokens: 50
stop: [END]
user: "Write creatively: {input}"
"""


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    folder = tmp_path / "prompts"
    folder.mkdir()
    (folder / "default.yaml").write_text('name: default\nuser: "{input}"\n')
    (folder / "creative.yaml").write_text(CREATIVE)
    return folder


Build = Callable[..., tuple[ChatService, CharClient]]


@pytest.fixture
def build(make_config: MakeConfig, prompts: Path) -> Build:
    def make(window: int = 100, max_tokens: int = 40, **overrides: object) -> tuple[ChatService, CharClient]:
        cfg: AppConfig = make_config(chat__max_tokens=max_tokens, chat__stream_flush_ms=0, **overrides)
        assert cfg.chat.system_prompt is None, "the budgets below count no system prompt"
        client = CharClient(window)
        svc = ChatService(cfg, ReadySupervisor(), client, TemplateStore(prompts))  # type: ignore[arg-type]
        return svc, client

    return make


def defaults(svc: ChatService) -> UserSettings:
    return UserSettings.defaults(svc.cfg)


# ----- fitting the window ----------------------------------------------------------------------------------
# window 100, max_tokens 40: 40 are kept for the reply, so the prompt may take 60.
async def test_a_conversation_exactly_at_the_budget_keeps_everything(build: Build) -> None:
    svc, _ = build(window=100, max_tokens=40)
    history = turn(1) + turn(2)  # 40 tokens
    request = await svc.build_request(history, "x" * 20, defaults(svc))
    assert request.messages == [*history, {"role": "user", "content": "x" * 20}]
    assert (request.prompt_tokens, request.dropped) == (60, 0)
    assert request.sampling["max_tokens"] == 40


async def test_one_token_over_the_budget_drops_the_oldest_turn(build: Build) -> None:
    svc, _ = build(window=100, max_tokens=40)
    history = turn(1) + turn(2)
    request = await svc.build_request(history, "x" * 21, defaults(svc))
    assert request.messages == [*turn(2), {"role": "user", "content": "x" * 21}]
    assert request.dropped == 2, "one turn: its user message and its reply"
    assert request.prompt_tokens == 41 and request.sampling["max_tokens"] == 40


async def test_a_caller_that_keeps_no_counts_pays_one_count_where_the_conversation_fits(build: Build) -> None:
    """The API's callers send the whole conversation each time: one count of the whole prompt, not one per turn;
    where it does not fit, the turns are counted and trimmed as for a chat that kept none."""
    svc, client = build(window=1000, max_tokens=40)
    asked: list[list[Message]] = []
    count = client.count_tokens

    async def recording(messages: list[Message]) -> int:
        asked.append(messages)
        return await count(messages)

    client.count_tokens = recording  # type: ignore[method-assign]
    history, new = turn(1) + turn(2) + turn(3), {"role": "user", "content": "x" * 20}
    request = await svc.build_request(history, new["content"], defaults(svc))
    assert asked == [[*history, new]], "one count, of the whole prompt"
    assert request.messages == [*history, new] and (request.prompt_tokens, request.dropped) == (80, 0)
    assert request.sampling["max_tokens"] == 40
    svc, client = build(window=100, max_tokens=40)
    for text in ("x" * 20, "x" * 21, "x" * 41):  # at the budget, one over, a turn over
        api = await svc.build_request(turn(1) + turn(2), text, defaults(svc))
        chat = await svc.build_request(turn(1) + turn(2), text, defaults(svc), kept=[])
        assert (api.messages, api.prompt_tokens, api.dropped) == (chat.messages, chat.prompt_tokens, chat.dropped)
        assert api.sampling["max_tokens"] == chat.sampling["max_tokens"]


async def test_the_trimmed_notice_comes_before_the_reply(build: Build) -> None:
    svc, client = build(window=100, max_tokens=40)
    session = svc.new_session()
    session.history = turn(1) + turn(2)
    events = [e async for e in svc.reply(session, "x" * 21)]
    assert events[0] == Notice("trimmed", {"dropped": 2})
    assert [type(e) for e in events[1:]] == [Started, Text, Text, Done]
    done = events[-1]
    assert isinstance(done, Done) and done.ending == "finished" and done.text == "ok"
    assert len(client.sent) == 1 and client.sent[0][0][0] == turn(2)[0], "the oldest turn was not sent"
    assert session.history == [*turn(1), *turn(2), {"role": "user", "content": "x" * 21}, done_turn("ok")]
    assert session.left_out == 2, "the trimmed turn stays out of the next prompts while the rest fits"
    # nothing dropped, no notice
    session = svc.new_session()
    session.history = turn(1)
    events = [e async for e in svc.reply(session, "y")]
    assert not any(isinstance(e, Notice) for e in events)


# window 400, max_tokens 200: 200 are kept for the reply; a long message may still use all but MIN_REPLY_TOKENS.
async def test_a_long_message_gets_a_shorter_reply_down_to_the_minimum(build: Build) -> None:
    svc, _ = build(window=400, max_tokens=200)
    request = await svc.build_request([], "x" * 250, defaults(svc))  # over the 200 left for the prompt
    assert request.prompt_tokens == 250 and request.sampling["max_tokens"] == 150, "what is left of the window"
    longest = 400 - MIN_REPLY_TOKENS
    request = await svc.build_request(turn(1), "x" * longest, defaults(svc))
    assert request.messages == [{"role": "user", "content": "x" * longest}], "the history goes first"
    assert request.dropped == 2 and request.prompt_tokens == longest
    assert request.sampling["max_tokens"] == MIN_REPLY_TOKENS


async def test_a_message_that_leaves_less_than_the_minimum_reply_is_refused(build: Build) -> None:
    svc, client = build(window=400, max_tokens=200)
    with pytest.raises(PromptTooLongError) as caught:
        await svc.build_request([], "x" * (400 - MIN_REPLY_TOKENS + 1), defaults(svc))
    assert caught.value.code == "context.too_long" and caught.value.hint
    session = svc.new_session()
    events = [e async for e in svc.reply(session, "x" * 400)]
    assert len(events) == 1 and isinstance(events[0], Refused) and isinstance(events[0].error, PromptTooLongError)
    assert client.sent == [] and session.history == []


async def test_the_reply_reserve_is_at_most_half_the_window(build: Build) -> None:
    svc, _ = build(window=100, max_tokens=512)  # 512 > 100: half the window is kept for the reply
    request = await svc.build_request([], "x" * 50, defaults(svc))
    assert request.sampling["max_tokens"] == 50
    with pytest.raises(PromptTooLongError):
        await svc.build_request([], "x" * 51, defaults(svc))  # MIN_REPLY_TOKENS > 50: no fallback


# ----- sampling -------------------------------------------------------------------------------------------
async def test_the_templates_sampling_wins_over_the_config(build: Build) -> None:
    svc, _ = build(window=4096, max_tokens=512)
    request = await svc.build_request([], "a poem about the sea", defaults(svc))
    assert request.template == "creative" and request.reason == Reason("keyword", "poem")
    assert request.sampling == {"temperature": 1.3, "top_p": 0.5, "max_tokens": 50, "stop": ["END"]}
    plain = await svc.build_request([], "hello", defaults(svc))
    assert plain.template == "default"
    assert plain.sampling == {"temperature": svc.cfg.chat.temperature, "top_p": svc.cfg.chat.top_p, "max_tokens": 512}


async def test_settings_the_user_changed_win_over_the_template_and_unchanged_ones_do_not(build: Build) -> None:
    svc, _ = build(window=4096, max_tokens=512)
    settings = defaults(svc)
    # temperature and max_tokens moved; top_p "moved" back to the configured default counts as unchanged
    settings.update({"temperature": 0.2, "max_tokens": 96, "top_p": svc.cfg.chat.top_p}, svc.cfg)
    assert settings.changed == {"temperature", "max_tokens"}
    request = await svc.build_request([], "a poem about the sea", settings)
    assert request.template == "creative"
    assert request.sampling == {"temperature": 0.2, "top_p": 0.5, "max_tokens": 96, "stop": ["END"]}


# ----- which template -------------------------------------------------------------------------------------
async def test_a_slash_command_picks_that_template_and_is_not_sent(build: Build) -> None:
    svc, _ = build(window=4096)
    request = await svc.build_request([], "/creative the sea", defaults(svc))
    assert (request.template, request.reason) == ("creative", COMMAND_REASON)
    assert request.user_text == "Write creatively: the sea"
    assert request.messages[-1] == {"role": "user", "content": "Write creatively: the sea"}


async def test_an_unknown_slash_command_is_refused_with_the_templates_listed(build: Build) -> None:
    svc, client = build(window=4096)
    with pytest.raises(InvalidInputError) as caught:
        await svc.build_request([], "/nosuch hello", defaults(svc))
    assert caught.value.code == "input.unknown_template"
    assert caught.value.params == {"name": "nosuch", "known": ", ".join(svc.templates.names())}
    assert client.sent == []


async def test_a_path_is_no_command_and_is_sent_as_it_is(build: Build) -> None:
    """As prompts/README.md and the template tests say: "/usr/bin/python 是什么" is a message, not a command."""
    svc, _ = build(window=4096)
    request = await svc.build_request([], "/usr/bin/python 是什么", defaults(svc))
    assert (request.template, request.user_text) == ("default", "/usr/bin/python 是什么")


async def test_a_template_picked_in_the_menu_takes_the_whole_message(build: Build) -> None:
    svc, _ = build(window=4096)
    request = await svc.build_request([], "the sea", defaults(svc), command="creative")
    assert (request.template, request.reason, request.user_text) == (
        "creative",
        COMMAND_REASON,
        "Write creatively: the sea",
    )


async def test_an_unknown_chosen_template_is_refused(build: Build) -> None:
    svc, client = build(window=4096)
    settings = defaults(svc)
    settings.update({"template": "nosuch"}, svc.cfg)
    with pytest.raises(InvalidInputError) as caught:
        await svc.build_request([], "hello", settings)
    assert caught.value.code == "input.unknown_template"
    assert "creative" in caught.value.message and caught.value.hint
    session = svc.new_session()
    session.settings = settings
    events = [e async for e in svc.reply(session, "hello")]
    assert len(events) == 1 and isinstance(events[0], Refused)
    assert events[0].error.code == "input.unknown_template" and client.sent == []


# ----- a message asked again (edited, or its reply regenerated) ----------------------------------------------------
async def test_a_message_asked_again_replaces_its_turn_and_drops_the_later_ones(build: Build) -> None:
    svc, client = build(window=1000, max_tokens=40)
    session = svc.new_session()
    session.history = turn(0)  # a resumed chat's turn: no message id is known for it
    for message_id, text in (("m1", "first"), ("m2", "second"), ("m3", "third")):
        [e async for e in svc.reply(session, text, message_id=message_id)]
    assert session.turn_ids == ["m1", "m2", "m3"] and len(session.history) == 8
    [e async for e in svc.reply(session, "second, edited", message_id="m2")]
    assert client.sent[-1][0] == [*turn(0), {"role": "user", "content": "first"}, done_turn("ok"),
                                  {"role": "user", "content": "second, edited"}]  # fmt: skip
    assert session.history == [*client.sent[-1][0], done_turn("ok")] and session.turn_ids == ["m1", "m2"]


def test_forgetting_an_unknown_message_keeps_the_history() -> None:
    session = ChatSession(UserSettings(0.7, 0.9, 64), history=turn(0))
    session.add_turn("u", "a", "m1")
    assert session.forget_from("nosuch") == 0 and session.forget_from("") == 0 and len(session.history) == 4
    assert session.forget_from("m1") == 1 and session.history == turn(0) and session.turn_ids == []


# ----- counting on the kept counts ----------------------------------------------------------------------------
class UsageStream(FakeStream):
    """Reports the engine's usage at the end, as vLLM does: the exact prompt, and the tokens it generated, which
    need not be what the reply's text is read as in the next prompt (`generated`: one per character, by default)."""

    def __init__(self, pieces: list[str], prompt_tokens: int, generated: int | None = None) -> None:
        super().__init__(pieces)
        self.prompt_tokens = prompt_tokens
        self.generated = len("".join(pieces)) if generated is None else generated

    async def __aiter__(self) -> AsyncIterator[str]:
        async for piece in super().__aiter__():
            yield piece
        self.stats.prompt_tokens = self.prompt_tokens
        self.stats.completion_tokens = self.generated


class TemplateClient(CharClient):
    """Counts like a chat template: 3 once (BOS, generation prompt), each message its characters plus 2; the
    replies' usage as the engine reports it. Records every count it was asked for."""

    def __init__(self, window: int, reply: str = "ok", generated: int | None = None) -> None:
        super().__init__(window)
        self.reply = reply
        self.generated = generated  # the usage figure of each reply (None: one per character)
        self.counted: list[list[Message]] = []

    async def count_tokens(self, messages: list[Message]) -> int:
        self.counted.append(messages)
        return self.exact(messages)

    @staticmethod
    def exact(messages: list[Message]) -> int:
        return 3 + sum(len(m["content"]) + 2 for m in messages)

    def stream(self, messages: list[Message], **sampling: Any) -> FakeStream:
        self.sent.append((messages, sampling))
        return UsageStream(list(self.reply), self.exact(messages), self.generated)


async def test_a_growing_chat_costs_two_small_counts_per_turn_and_keeps_exact_counts(build: Build) -> None:
    svc, _ = build(window=100_000, max_tokens=40)
    client = TemplateClient(100_000, reply="fine")
    svc.client = client  # type: ignore[assignment]
    session = svc.new_session()
    for i in range(30):
        before = len(client.counted)
        events = [e async for e in svc.reply(session, f"message {i}", message_id=f"m{i}")]
        done = events[-1]
        assert isinstance(done, Done) and done.ending == "finished"
        asked = client.counted[before:]
        message, reply = {"role": "user", "content": f"message {i}"}, {"role": "assistant", "content": "fine"}
        if i > 0:
            assert asked == [[message], [message, reply]], "the new message alone, and with its reply"
        assert done.prompt_tokens == client.exact(client.sent[-1][0]), "exact: what the engine was sent"
        assert done.tokens == (len(f"message {i}") + 2, len("fine") + 2) and done.counted_by == session.counted_by
    assert session.tokens == [len(m["content"]) + 2 for m in session.history], "every kept count exact"


async def test_a_reply_read_back_as_more_tokens_than_it_was_generated_as_never_overflows_the_window(
    build: Build,
) -> None:
    """A model's generated tokens need not be what its text is read as in the next prompt (a tiny random model's
    replies read back as twice their usage): the kept counts are counts, not usage, and a chat that grows past the
    window is trimmed on them, every prompt within the window less the reply's room."""
    svc, _ = build(window=400, max_tokens=40)
    client = TemplateClient(400, reply="a longer reply than its usage says", generated=1)
    svc.client = client  # type: ignore[assignment]
    session = svc.new_session()
    for i in range(30):
        done = [e async for e in svc.reply(session, f"message {i}", message_id=f"m{i}")][-1]
        assert isinstance(done, Done) and done.ending == "finished", done
        sent, sampling = client.sent[-1]
        assert done.prompt_tokens == client.exact(sent) and client.exact(sent) + sampling["max_tokens"] <= 400
        assert client.exact(sent) <= 400 - 40, "the reply keeps its room: the prompt is within the budget"
    assert session.left_out > 0, "the chat outgrew the window and was trimmed"


class OrderedClient(TemplateClient):
    """A TemplateClient that also records, in order, when a prompt was sent and when a count was asked."""

    def __init__(self, window: int, reply: str = "ok") -> None:
        super().__init__(window, reply)
        self.order: list[str] = []

    async def count_tokens(self, messages: list[Message]) -> int:
        self.order.append("count")
        return await super().count_tokens(messages)

    def stream(self, messages: list[Message], **sampling: Any) -> FakeStream:
        self.order.append("send")
        stream = super().stream(messages, **sampling)
        stream.hold = self.hold
        return stream

    hold: asyncio.Event | None = None  # set: each reply's stream waits for it after its first piece


async def test_far_within_the_window_a_message_is_sent_first_and_counted_after_its_reply(build: Build) -> None:
    svc, _ = build(window=400, max_tokens=40)
    client = OrderedClient(400, reply="fine")
    svc.client = client  # type: ignore[assignment]
    session = svc.new_session()
    sizes, fars = [], []
    for i in range(12):
        client.order.clear()
        text = f"message {i} " * 4
        # sent at once, counted after, where the overhead (3), the kept counts of what is still sent and the
        # message's bound (its 2 markers + a token per byte + 1 + the margin of 4) fit the budget (400 - 40)
        sent = session.kept_tokens()[session.left_out :]
        far = 3 + sum(t or 0 for t in sent) + 2 + len(text.encode()) + 1 + 4 <= 400 - 40
        fars.append(far)
        done = [e async for e in svc.reply(session, text, message_id=f"m{i}")][-1]
        assert isinstance(done, Done) and done.ending == "finished"
        sizes.append(client.exact(client.sent[-1][0]))
        frame_counts = ["count"] * 3 if i == 0 else []  # the template's fixed parts, measured once
        # the reply is counted with its message after it either way; far within the window the message beside it
        expected = [*frame_counts, "send", "count", "count"] if far else [*frame_counts, "count", "send", "count"]
        assert client.order == expected, (i, client.order, sizes)
        assert done.tokens == (len(text) + 2, len("fine") + 2), "the message's and the reply's counts exact either way"
        assert done.prompt_tokens == client.exact(client.sent[-1][0]), "exact"
    assert fars[:5] == [True] * 5 and False in fars, "the chat grew from far within the window to near its budget"
    assert session.left_out > 0 and fars[-1], "trimmed there (to chat.trim_to of the room): far again after it"
    assert session.tokens == [len(m["content"]) + 2 for m in session.history], "every count exact"


async def test_a_stopped_reply_leaves_its_uncounted_message_for_the_next_count(build: Build) -> None:
    svc, _ = build(window=100_000, max_tokens=40)
    client = OrderedClient(100_000, reply="fine and more")
    svc.client = client  # type: ignore[assignment]
    session = svc.new_session()
    [e async for e in svc.reply(session, "first", message_id="m0")]
    client.order.clear()
    client.hold = asyncio.Event()  # the engine decodes on while the stop button lands (never set: a long reply)
    events: list[Any] = []
    first_text = asyncio.Event()

    async def run_turn() -> None:  # as the app runs a turn (backend.chat.live): a task that awaits only the turn
        async for event in svc.reply(session, "second", message_id="m1"):
            events.append(event)
            if isinstance(event, Text):
                first_text.set()

    task = asyncio.create_task(run_turn())
    await asyncio.wait_for(first_text.wait(), 30)
    task.cancel()  # the stop button, as the app presses it
    await asyncio.gather(task, return_exceptions=True)
    client.hold = None
    done = events[-1]
    assert isinstance(done, Done) and done.ending == "stopped" and done.text, done
    assert client.order == ["send"], "a stopped reply's message is not counted after it"
    assert session.kept_tokens()[2] is None, "its message stays uncounted"
    client.order.clear()
    [e async for e in svc.reply(session, "third", message_id="m2")]
    assert client.order[:3] == ["count", "count", "send"], "the new message and the uncounted turn, before sending"
    turn = session.history[2:4]
    assert sum(t or 0 for t in session.tokens[2:4]) == sum(len(m["content"]) + 2 for m in turn), "counted with its turn"


async def test_trimming_on_kept_counts_is_exact_at_the_budget(build: Build) -> None:
    svc, _ = build(window=200, max_tokens=40)  # the prompt may take 160
    client = TemplateClient(200, reply="fine")
    svc.client = client  # type: ignore[assignment]
    session = svc.new_session()
    for i in range(3):
        [e async for e in svc.reply(session, "x" * 20, message_id=f"m{i}")]
    # history: 3 turns of (22 + 6) = 84
    assert sum(session.kept_tokens()) == 84
    text = "y" * (160 - 3 - 2 - 84)  # exactly at the budget on the kept counts
    request = await svc.build_request(session.history, text, session.settings, None, session.kept_tokens())
    assert (request.dropped, request.prompt_tokens) == (0, 160)
    over = await svc.build_request(session.history, text + "y", session.settings, None, session.kept_tokens())
    assert over.dropped == 2 and over.prompt_tokens == client.exact(over.messages)


async def test_kept_counts_of_another_model_are_counted_again(build: Build) -> None:
    svc, _ = build(window=100_000, max_tokens=40)
    client = TemplateClient(100_000)
    svc.client = client  # type: ignore[assignment]
    session = svc.resumed_session(turn(1), {}, [], ([999, 999], "another-model@vllm"))
    [e async for e in svc.reply(session, "hello")]
    assert turn(1) in client.counted, "the saved turn was counted again, once"
    assert session.counted_by == svc.counter_id() and sum(session.tokens[:2]) == 24
    kept = svc.resumed_session(turn(1), {}, [], ([12, 12], svc.counter_id()))
    client.counted.clear()
    [e async for e in svc.reply(kept, "hello")]
    hello, ok = {"role": "user", "content": "hello"}, {"role": "assistant", "content": "ok"}
    assert client.counted == [[hello], [hello, ok]], "this model's kept counts: the new turn only"


async def test_the_workshops_view_shares_the_token_accounting(build: Build, prompts: Path) -> None:
    svc, _ = build(window=1000)
    client = TemplateClient(1000)
    svc.client = client  # type: ignore[assignment]
    await svc.build_request([], "hello", defaults(svc))
    view = svc.with_templates(TemplateStore(prompts))
    assert view.accounting() is svc.accounting() and view.client is svc.client
    client.counted.clear()
    await view.build_request([], "hello", defaults(view))
    assert client.counted == [[{"role": "user", "content": "hello"}]], "the fixed parts are not measured again"


async def test_an_engine_that_cannot_count_keeps_its_estimates(build: Build) -> None:
    """No /tokenize (the client counts None): the conservative estimates stay, whatever the usage says."""
    svc, _ = build(window=100_000, max_tokens=40)
    client = TemplateClient(100_000, reply="fine")

    async def cannot_count(messages: list[Message]) -> None:
        return None

    client.count_tokens = cannot_count  # type: ignore[method-assign,assignment]
    svc.client = client  # type: ignore[assignment]
    session = svc.new_session()
    for i in range(3):
        [e async for e in svc.reply(session, f"message {i}")]
    # the replies' counts are estimates too (what the estimate adds for the reply), never the usage figure
    reply = estimate_tokens([{"role": "assistant", "content": "fine"}]) - estimate_tokens([])
    assert session.tokens[1::2] == [reply] * 3 and reply > len("fine") + 1, session.tokens
    assert all(t is not None and t > 0 for t in session.tokens)


# ----- passages of the user's documents (backend.chat.sources) ---------------------------------------------
class Shelf:
    """A Finder with fixed passages, best first; records what it was asked."""

    def __init__(self, *texts: str) -> None:
        self.sources = [Source(n, "notes.md", "d", n, text, heading="Notes") for n, text in enumerate(texts, 1)]
        self.asked: list[tuple[str, str, int]] = []

    async def find(self, owner: str, question: str, count: int) -> list[Source]:
        self.asked.append((owner, question, count))
        return self.sources[:count]


async def test_passages_go_into_the_user_message_and_the_next_prompt_begins_with_this_one(build: Build) -> None:
    svc, client = build(window=2000, max_tokens=40)
    svc.finder = shelf = Shelf("The vault code is K7-31.", "The door is blue.")
    session = svc.new_session()
    session.owner = "user:alice"
    first = [e async for e in svc.reply(session, "/creative the vault code?")]
    assert shelf.asked == [("user:alice", "the vault code?", svc.cfg.documents.passages)], "not the command"
    sent = client.sent[-1][0][-1]["content"]
    assert sent == with_sources("Write creatively: the vault code?", shelf.sources)
    done = first[-1]
    assert isinstance(done, Done) and done.sources == tuple(shelf.sources) and done.user_text == sent
    [e async for e in svc.reply(session, "and the door?")]
    second = client.sent[-1][0]
    assert second[:2] == [{"role": "user", "content": sent}, {"role": "assistant", "content": "ok"}]


async def test_passages_take_no_more_than_their_share_of_the_room(build: Build) -> None:
    # window 1000, reply 40: the prompt's room is 960 tokens, documents.share 0.25 of it is 240
    svc, _ = build(window=1000, max_tokens=40, documents__share=0.25)
    svc.finder = shelf = Shelf("a" * 300, "b" * 300, "c" * 300)  # ~113 tokens each by the estimate
    request = await svc.build_request([], "question", defaults(svc), owner="user:alice")
    assert [s.number for s in request.sources] == [1, 2]
    assert "b" * 300 in request.messages[-1]["content"] and "c" * 300 not in request.messages[-1]["content"]
    assert shelf.asked[-1][2] == 3


async def test_no_passages_without_an_owner_or_where_the_template_sends_none(build: Build, prompts: Path) -> None:
    (prompts / "plain.yaml").write_text('name: plain\nkeywords: [plain]\ndocuments: false\nuser: "{input}"\n')
    (prompts / "one.yaml").write_text('name: one\nkeywords: [single]\npassages: 1\nuser: "{input}"\n')
    svc, _ = build(window=2000)
    svc.finder = shelf = Shelf("first", "second")
    assert (await svc.build_request([], "a question", defaults(svc))).sources == []  # no owner: the workshop, the API
    plain = await svc.build_request([], "plain question", defaults(svc), owner="user:alice")
    assert plain.sources == [] and plain.messages[-1]["content"] == "plain question" and shelf.asked == []
    one = await svc.build_request([], "single question", defaults(svc), owner="user:alice")
    assert [s.text for s in one.sources] == ["first"]
