"""The chat workload: conversations drawn from the seed, and the runner against the stand-in engine in process."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from backend.benchmarks.chat_workload import (
    ChatLevel,
    ChatShape,
    TurnResult,
    conversation,
    conversations,
    run_chat_level,
    tag,
)
from backend.benchmarks.workload import WORDS
from tests.stub_engine import DONE, Exchange, StubEngine, chunk, piece, status, usage, word_ids

CHUNK_S = 0.01  # the stub's time per streamed token: long enough that concurrent conversations overlap
TAG = re.compile(r"^\[c(\d{4})-(\d{6})\] ")


def test_the_same_seed_draws_the_same_conversations_whatever_the_number_asked() -> None:
    shape = ChatShape(seed=7)
    few, many = conversations(shape, 8), conversations(shape, 40)
    assert len(few) == 2 and len(many) == 10
    assert few == many[:2] == [conversation(ChatShape(seed=7), i) for i in range(2)]
    assert conversations(ChatShape(seed=8), 8) != few


def test_lengths_are_drawn_within_their_ranges() -> None:
    shape = ChatShape(turns=3, message_tokens=(20, 80), reply_tokens=(100, 300))
    chats = conversations(shape, 300)
    turns = [turn for chat in chats for turn in chat.turns]
    assert len(turns) == 300 and all(len(chat.turns) == 3 for chat in chats)
    replies = [turn.reply_tokens for turn in turns]
    assert all(100 <= r <= 300 for r in replies) and len(set(replies)) > 50
    words = [len(turn.message.split()) for turn in turns]
    assert all(round(20 / 1.5) <= w <= round(80 / 1.5) for w in words)
    assert all(word in WORDS for turn in turns for word in turn.message.split())


def test_turns_in_all_are_the_requests_asked_for() -> None:
    chats = conversations(ChatShape(turns=4), 10)
    assert [len(c.turns) for c in chats] == [4, 4, 2]
    assert chats[2].turns == conversation(ChatShape(turns=4), 2).turns[:2]


def test_tags_are_unique_to_the_conversation_and_the_call() -> None:
    assert len({tag(i, 42) for i in range(10_000)}) == 10_000
    assert tag(3, 42) != tag(3, 43) and len(tag(3, 42)) == len(tag(9999, 999_999))


def test_shapes_that_make_no_sense_are_refused() -> None:
    for bad in ({"turns": 0}, {"message_tokens": (0, 5)}, {"reply_tokens": (30, 20)}):
        [field] = bad
        with pytest.raises(ValueError, match=f"^{field} must be "):  # the field at fault, named first
            ChatShape(**bad)  # type: ignore[arg-type]


@dataclass
class Seen:
    """One request the stub answered."""

    conversation: int
    salt: int
    body: dict[str, Any]
    start: float
    end: float = 0.0


@dataclass
class Stub:
    """The stand-in engine (tests/stub_engine.py) streaming `max_tokens` one-word chunks, as llama-server would: an
    opening chunk, the words, the usage with how much of the prompt its slot held; conversation `fail` gets HTTP 500
    at turn 2."""

    url: str = ""
    fail: int | None = None
    burst: bool = False  # send every chunk at once (a server whose sending thread was starved of CPU)
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, ex: Exchange) -> None:
        messages = ex.body["messages"]
        found = TAG.match(messages[1]["content"])
        assert found, messages
        seen = Seen(int(found[1]), int(found[2]), ex.body, time.monotonic())
        with self.lock:
            self.seen.append(seen)
        turn = (len(messages) - 2) // 2
        if seen.conversation == self.fail and turn == 1:
            seen.end = time.monotonic()
            status(500, "boom")(ex)
            return
        opening = chunk(ex.model, [{"index": 0, "delta": {"role": "assistant", "content": ""}}])
        replied = [piece(ex.model, " " + word) for word in reply_words(seen.conversation, turn, ex.body["max_tokens"])]
        prompt = len(word_ids(messages))
        counts = usage(ex.model, prompt, ex.body["max_tokens"])
        # llama-server's way of saying how much of the prompt its slot already held: all but the new message
        counts["timings"] = {"cache_n": prompt - len(word_ids(messages[-1:])) if turn else 0}
        events = [opening, *replied, counts]
        ex.open_stream()
        if self.burst:
            time.sleep(CHUNK_S * len(events))
        for data in events:
            ex.send(data)
            if not self.burst:
                time.sleep(CHUNK_S)
        seen.end = time.monotonic()  # before [DONE]: the client sends its next turn only after it
        ex.send(DONE)
        ex.end_stream()


def reply_words(conv: int, turn: int, n: int) -> list[str]:
    return [f"r{conv}.{turn}.{i}" for i in range(n)]


@pytest.fixture
def stub() -> Iterator[Stub]:
    state = Stub()
    with StubEngine(state.answer) as server:
        state.url = server.url
        yield state


SMALL = ChatShape(turns=3, message_tokens=(5, 10), reply_tokens=(3, 6), seed=3)


async def test_each_turn_sends_the_history_with_the_text_received(stub: Stub) -> None:
    level = await run_chat_level(stub.url + "/v1", "k", "m", users=2, requests=6, shape=SMALL)
    assert isinstance(level, ChatLevel) and len(level.turns) == 6 and all(t.success for t in level.turns)
    chats = conversations(SMALL, 6)
    for seen in stub.seen:
        messages = seen.body["messages"]
        turn = (len(messages) - 2) // 2
        drawn = chats[seen.conversation].turns
        roles = [m["role"] for m in messages]
        assert roles == ["system", *["user", "assistant"] * turn, "user"]
        assert TAG.sub("", messages[1]["content"]) == drawn[0].message
        assert TAG.sub("", messages[-1]["content"]) == drawn[turn].message
        for earlier in range(turn):  # what came back, as it came back
            received = "".join(" " + w for w in reply_words(seen.conversation, earlier, drawn[earlier].reply_tokens))
            assert messages[2 + 2 * earlier]["content"] == received
        body = seen.body
        reply = drawn[turn].reply_tokens
        assert (body["max_tokens"], body["min_tokens"], body["ignore_eos"]) == (reply, reply, True)
        assert body["stream_options"] == {"include_usage": True} and body["temperature"] == 0.0
    assert len({s.salt for s in stub.seen}) == 1  # one call, one salt
    first_turns = [s.body["messages"][1]["content"] for s in stub.seen if len(s.body["messages"]) == 2]
    assert len({TAG.match(text)[0] for text in first_turns}) == len(first_turns) == 2  # type: ignore[index]
    for result in level.turns:
        drawn = chats[result.conversation].turns[result.turn]
        assert result.output_tokens == drawn.reply_tokens
        assert result.first_text_s is not None and result.first_text_s > 0
        assert result.decode_tok_s is not None and 0 < result.decode_tok_s < 2 / CHUNK_S
    by_conv = {c: [t.prompt_tokens for t in level.turns if t.conversation == c] for c in (0, 1)}
    assert all(a < b < c for a, b, c in by_conv.values())  # histories grow
    for result in level.turns:  # the server's cache figure (llama-server's timings.cache_n) is read
        new = (
            len(chats[result.conversation].turns[result.turn].message.split()) if result.turn else result.prompt_tokens
        )
        assert result.cached_tokens == result.prompt_tokens - new, result


async def test_pinned_conversations_name_their_slot_and_others_let_the_server_choose(stub: Stub) -> None:
    await run_chat_level(stub.url, "k", "m", users=3, requests=12, shape=SMALL)
    assert all("id_slot" not in seen.body for seen in stub.seen)
    stub.seen.clear()
    pinned = replace(SMALL, pin_slots=2)
    await run_chat_level(stub.url, "k", "m", users=3, requests=12, shape=pinned)
    assert stub.seen and all(seen.body["id_slot"] == seen.conversation % 2 for seen in stub.seen)
    with pytest.raises(ValueError, match="pin_slots"):
        replace(SMALL, pin_slots=-1)


async def test_turns_of_a_conversation_are_sequential_and_users_run_at_once(stub: Stub) -> None:
    shape = ChatShape(turns=2, message_tokens=(5, 5), reply_tokens=(8, 8), seed=1)
    await run_chat_level(stub.url, "k", "m", users=3, requests=12, shape=shape)
    assert len(stub.seen) == 12
    for conv in range(6):
        mine = sorted((s for s in stub.seen if s.conversation == conv), key=lambda s: s.start)
        assert [len(s.body["messages"]) for s in mine] == [2, 4]
        assert mine[0].end <= mine[1].start  # the second turn waits for the first reply
    most = max(sum(1 for s in stub.seen if s.start <= t.start < s.end) for t in stub.seen)
    assert most == 3  # three users at once, never more


async def test_chunks_that_arrive_together_are_told_from_chunks_that_stream(stub: Stub) -> None:
    paced = (await run_chat_level(stub.url, "k", "m", 1, 2, SMALL)).summary()
    stub.burst = True
    bunched = (await run_chat_level(stub.url, "k", "m", 1, 2, SMALL)).summary()
    assert paced["bunched"]["max"] < 0.5, paced["bunched"]
    assert bunched["bunched"]["p50"] > 0.5, bunched["bunched"]


async def test_a_server_error_fails_the_turn_and_ends_its_conversation(stub: Stub) -> None:
    stub.fail = 1
    level = await run_chat_level(stub.url, "k", "m", users=2, requests=9, shape=SMALL)
    failed = [t for t in level.turns if not t.success]
    assert [(t.conversation, t.turn) for t in failed] == [(1, 1)]
    assert failed[0].error is not None and "HTTP 500" in failed[0].error
    assert [t.turn for t in level.turns if t.conversation == 1] == [0, 1]  # turn 2 never sent
    assert all(t.success for t in level.turns if t.conversation != 1) and len(level.turns) == 8
    summary = level.summary()
    assert (summary["errors"], summary["turns"], summary["users"]) == (1, 8, 2)
    assert summary["error_samples"] == [failed[0].error]


async def test_a_server_that_does_not_answer_is_a_failed_turn_not_an_exception() -> None:
    level = await run_chat_level("http://127.0.0.1:9", "k", "m", users=2, requests=4, shape=SMALL, timeout_s=5)
    assert len(level.turns) == 2 and not any(t.success for t in level.turns)
    assert level.summary()["first_text_ms"] is None


def test_the_summary_of_a_level() -> None:
    turns = [
        TurnResult(0, 0, True, first_text_s=0.1, decode_tok_s=50.0, prompt_tokens=30, output_tokens=100),
        TurnResult(
            0, 1, True, first_text_s=0.2, decode_tok_s=40.0, prompt_tokens=150, output_tokens=200, cached_tokens=120
        ),
        TurnResult(1, 0, True, first_text_s=0.3, decode_tok_s=20.0, prompt_tokens=40, output_tokens=100),
        TurnResult(1, 1, False, error="HTTP 500: boom"),
    ]
    summary = ChatLevel(users=2, turns=turns, duration_s=10.0).summary()
    assert summary["output_tok_s"] == pytest.approx(40.0)
    assert summary["first_text_ms"]["p50"] == pytest.approx(200.0)
    assert summary["first_text_ms"]["p99"] == pytest.approx(298.0)
    assert summary["decode_tok_s"] == {"p50": 40.0, "min": 20.0}
    assert summary["tpot_ms"]["p50"] == pytest.approx(25.0)
    assert summary["prompt_tokens"] == {"mean": pytest.approx(220 / 3), "max": 150}
    assert (summary["errors"], summary["conversations"], summary["turns"]) == (1, 2, 4)
    assert summary["history_cached"] == pytest.approx(0.8), "later turns only: 120 of 150 prompt tokens cached"
