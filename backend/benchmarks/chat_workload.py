"""A chat-shaped benchmark workload: users holding conversations of several turns whose history grows.

Conversation i is drawn from the seed alone (its new user messages and its reply lengths), so every level and
round sends the same work. Each turn sends the whole history (a short system line, the earlier turns with the
text actually received) plus the new message; replies run to their drawn length (ignore_eos, max_tokens =
min_tokens), so the engine's prefix cache of the history counts as it would in a chat. `users` workers start
at once and take whole conversations from one queue, each conversation's turns in order.

The first message of a conversation starts with a tag unique to it and to the call ([c0003-482913]: the
conversation, then a number drawn per call, of fixed width), so no two conversations share a prefix beyond the
system line, and a conversation sent again at the next level or round is not served from the engine's cache
of the last time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

import httpx

from backend.benchmarks.loadgen import Streamed, stream_chat
from backend.benchmarks.stats import percentile
from backend.benchmarks.workload import ESTIMATED_TOKENS_PER_WORD, WORDS, Message
from backend.engines.base import bearer

log = logging.getLogger(__name__)

SYSTEM = "You are a helpful assistant."
ERROR_SAMPLES = 5
BUNCHED_S = 0.001


@dataclass(frozen=True)
class ChatShape:
    """What the conversations look like; every length is drawn from `seed`, inclusive ranges in tokens."""

    turns: int = 4  # turns per conversation
    message_tokens: tuple[int, int] = (20, 80)  # new user message (approximate: words of the WORDS filler)
    reply_tokens: tuple[int, int] = (100, 300)  # reply (exact: ignore_eos)
    seed: int = 0
    # llama-server: send conversation i to slot i % pin_slots (its id_slot), so its history stays where it was
    # cached; 0 lets the server choose (the slot whose cached prompt shares most with the new one, else the oldest).
    pin_slots: int = 0

    def __post_init__(self) -> None:
        if self.pin_slots < 0:
            raise ValueError(f"pin_slots must be 0 or more, not {self.pin_slots}")
        if self.turns < 1:
            raise ValueError(f"turns must be at least 1, not {self.turns}")
        for name in ("message_tokens", "reply_tokens"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ValueError(f"{name} must be a range LOW-HIGH with 1 <= LOW <= HIGH, not {low}-{high}")


@dataclass(frozen=True)
class Turn:
    """One turn of a generated conversation: the new user message and the reply's length in tokens."""

    message: str
    reply_tokens: int


@dataclass(frozen=True)
class Conversation:
    """One generated conversation: its number and its turns, in order."""

    index: int
    turns: tuple[Turn, ...]


@dataclass
class TurnResult:
    """What one turn measured; times in seconds."""

    conversation: int
    turn: int
    success: bool
    error: str | None = None
    first_text_s: float | None = None  # from sending to the first chunk with text (what a user first sees)
    first_chunk_s: float | None = None  # to the first chunk with a token, text or not (random weights: no text)
    decode_tok_s: float | None = None  # (output_tokens - 1) / (time of last chunk - time of first chunk)
    prompt_tokens: int = 0  # from the usage chunk (stream_options include_usage)
    output_tokens: int = 0
    cached_tokens: int | None = None  # of prompt_tokens, taken from the server's prefix cache (where it says)
    # Share of the gaps between chunks under BUNCHED_S: chunks that arrived together instead of as they were
    # decoded (a server thread starved of CPU sends them in bursts, and decode_tok_s then overstates its pace).
    bunched: float | None = None


@dataclass
class ChatLevel:
    """One level: `users` at once, every turn's result, the wall time."""

    users: int
    turns: list[TurnResult]
    duration_s: float

    def summary(self) -> dict[str, Any]:
        """The level's figures (times in ms): throughput, first text, decode speed per reply, prompt sizes."""
        done = [t for t in self.turns if t.success]
        output = sum(t.output_tokens for t in done)
        first_text = [t.first_text_s * 1000 for t in done if t.first_text_s is not None]
        first_chunk = [t.first_chunk_s * 1000 for t in done if t.first_chunk_s is not None]
        decode = [t.decode_tok_s for t in done if t.decode_tok_s]
        prompts = [t.prompt_tokens for t in done]
        bunched = [t.bunched for t in done if t.bunched is not None]
        # Later turns of a conversation: their history is what a prefix cache (a slot's, or vLLM's) can serve.
        later = [t for t in done if t.turn > 0 and t.cached_tokens is not None and t.prompt_tokens]
        errors = [t.error or "failed" for t in self.turns if not t.success]
        return {
            "users": self.users,
            "conversations": len({t.conversation for t in self.turns}),
            "turns": len(self.turns),
            "errors": len(errors),
            "duration_s": self.duration_s,
            "output_tokens": output,
            "output_tok_s": output / self.duration_s if self.duration_s > 0 else 0.0,
            "first_text_ms": {f"p{p}": percentile(first_text, p) for p in (50, 90, 99)} if first_text else None,
            "first_chunk_ms": {"p50": percentile(first_chunk, 50)} if first_chunk else None,
            "decode_tok_s": {"p50": percentile(decode, 50), "min": min(decode)} if decode else None,
            "tpot_ms": {"p50": percentile([1000 / d for d in decode], 50)} if decode else None,
            "prompt_tokens": {"mean": statistics.fmean(prompts), "max": max(prompts)} if prompts else None,
            "bunched": {"p50": percentile(bunched, 50), "max": max(bunched)} if bunched else None,
            # The share of later turns' prompt tokens served from the cache (1.0: only the new message computed).
            "history_cached": (
                sum(t.cached_tokens or 0 for t in later) / sum(t.prompt_tokens for t in later) if later else None
            ),
            "error_samples": sorted(set(errors))[:ERROR_SAMPLES],
        }


def tag(conversation: int, salt: int) -> str:
    """The start of a conversation's first message: unique to the conversation and to the call (`salt`)."""
    return f"[c{conversation:04d}-{salt:06d}] "


def conversation(shape: ChatShape, index: int) -> Conversation:
    """Conversation `index` of `shape`: drawn from the seed and the index alone, the same at every level."""
    rng = random.Random(f"chat-workload:{shape.seed}:{index}")
    turns = []
    for _ in range(shape.turns):
        words = max(1, round(rng.randint(*shape.message_tokens) / ESTIMATED_TOKENS_PER_WORD))
        turns.append(Turn(" ".join(rng.choices(WORDS, k=words)), rng.randint(*shape.reply_tokens)))
    return Conversation(index, tuple(turns))


def conversations(shape: ChatShape, requests: int) -> list[Conversation]:
    """ceil(requests / turns) conversations holding `requests` turns in all (the last one cut short if need be)."""
    count = math.ceil(requests / shape.turns)
    chosen = [conversation(shape, i) for i in range(count)]
    if chosen and (extra := count * shape.turns - requests):
        last = chosen[-1]
        chosen[-1] = Conversation(last.index, last.turns[: shape.turns - extra])
    return chosen


def _turn_result(index: int, turn: int, streamed: Streamed) -> TurnResult:
    if streamed.error is not None:
        return TurnResult(index, turn, success=False, error=streamed.error)
    first, last = streamed.chunk_times[0], streamed.chunk_times[-1]
    output = streamed.completion_tokens or streamed.token_chunks
    first_text = None if streamed.first_text_at is None else streamed.first_text_at - streamed.start
    decode = (output - 1) / (last - first) if output > 1 and last > first else None
    gaps = [b - a for a, b in zip(streamed.chunk_times, streamed.chunk_times[1:], strict=False)]
    bunched = sum(g < BUNCHED_S for g in gaps) / len(gaps) if gaps else None
    return TurnResult(
        index, turn, True, None, first_text, first - streamed.start, decode, streamed.prompt_tokens, output,
        streamed.cached_tokens, bunched,
    )  # fmt: skip


async def _hold(
    http: httpx.AsyncClient, url: str, headers: dict[str, str], model: str, chat: Conversation, salt: int,
    temperature: float, pin_slots: int = 0,
) -> list[TurnResult]:  # fmt: skip
    """One conversation's turns in order, each with the history so far; a failed turn ends it."""
    history: list[Message] = [{"role": "system", "content": SYSTEM}]
    results: list[TurnResult] = []
    for number, turn in enumerate(chat.turns):
        text = tag(chat.index, salt) + turn.message if number == 0 else turn.message
        history.append({"role": "user", "content": text})
        body = {
            "model": model,
            "messages": history,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": temperature,
            "max_tokens": turn.reply_tokens,
            "min_tokens": turn.reply_tokens,
            "ignore_eos": True,
        }
        if pin_slots:
            body["id_slot"] = chat.index % pin_slots
        streamed = await stream_chat(http, url, headers, body)
        results.append(_turn_result(chat.index, number, streamed))
        if streamed.error is not None:
            log.debug("conversation %d ended at turn %d: %s", chat.index, number, streamed.error)
            break
        history.append({"role": "assistant", "content": "".join(streamed.text)})
    return results


async def run_chat_level(
    base_url: str,
    api_key: str,
    model: str,
    users: int,
    requests: int,
    shape: ChatShape,
    temperature: float = 0.0,
    timeout_s: float = 600.0,
) -> ChatLevel:
    """Hold ceil(requests / shape.turns) conversations, `users` at once, against /v1/chat/completions."""
    url = base_url.rstrip("/").removesuffix("/v1") + "/v1/chat/completions"
    headers = bearer(api_key)
    salt = random.SystemRandom().randrange(10**6)
    queue = iter(conversations(shape, requests))  # shared: each conversation goes to one worker
    turns: list[TurnResult] = []
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s, connect=10.0),
        # A connection per request: llama-server closes some connections after a streamed reply without saying so,
        # and a reused one then fails the next request ("Server disconnected without sending a response").
        limits=httpx.Limits(max_connections=users + 4, max_keepalive_connections=0),
        trust_env=False,
    ) as http:

        async def user() -> None:
            for chat in queue:
                turns.extend(await _hold(http, url, headers, model, chat, salt, temperature, shape.pin_slots))

        start = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(max(1, users))))
        duration = time.perf_counter() - start
    turns.sort(key=lambda t: (t.conversation, t.turn))
    return ChatLevel(users, turns, duration)
