"""What a benchmark sends: synthetic prompts of an exact token length, or the shipped Chinese prompt set.

Every request starts with a tag unique within the run, so the server's prefix cache never serves one
request from another's work (the HF baseline has no such cache; the comparison stays fair).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

from backend.chat.context import Message
from backend.errors import ServiceError

log = logging.getLogger(__name__)

CountTokens = Callable[[list[Message]], Awaitable[int | None]]

DEFAULT_PROMPT_SET = Path(__file__).with_name("prompts_zh.jsonl")
CATEGORIES = ("writing", "summary", "translation", "code", "qa")
# Filler for synthetic prompts: common Chinese words and English words, as a chat would hold.
WORDS = (
    "我们 今天 天气 学习 工作 时间 问题 方法 系统 数据 模型 服务 用户 城市 文化 历史 科学 技术 发展 经济 "
    "生活 朋友 老师 学生 音乐 电影 旅行 春天 夏天 秋天 冬天 北京 上海 长江 黄河 计算 网络 文章 故事 设计 "
    "the of and model data system user city time work learn music river spring summer winter story design "
    "network answer question simple quick future history science language reason value method result"
).split()
ESTIMATED_TOKENS_PER_WORD = 1.5
PADDING = ("。", "的", " a", "!", " ")  # short endings tried, in order, to reach the exact length


class WorkloadError(ServiceError):
    """The prompt set file cannot be used as it is."""

    key = "error.workload"


@dataclass(frozen=True)
class PromptItem:
    """One entry of a prompt set file."""

    id: str
    category: str
    prompt: str
    max_tokens: int
    system: str | None = None


@dataclass(frozen=True)
class BenchRequest:
    """One request of a benchmark: the chat messages and how many tokens to generate."""

    messages: list[Message]
    max_tokens: int
    label: str


@dataclass
class Tagger:
    """Numbers requests across the whole run."""

    counter: count[int] = field(default_factory=count)

    def tag(self) -> str:
        return f"[#{next(self.counter):05d}] "


def load_prompt_set(path: Path) -> list[PromptItem]:
    """Read a JSONL prompt set (one object per line: id, category, prompt, max_tokens[, system])."""
    if not path.exists():
        raise WorkloadError(f"Prompt set {path} does not exist.", "Pass --prompts with an existing JSONL file.")
    items: list[PromptItem] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where}: not valid JSON ({exc.msg}).", "Write one JSON object per line.") from exc
        if not isinstance(data, dict):
            raise WorkloadError(f"{where}: expected a JSON object.", "Write one JSON object per line.")
        unknown = set(data) - {"id", "category", "prompt", "max_tokens", "system"}
        if unknown:
            raise WorkloadError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}.", "Remove them.")
        prompt, max_tokens = data.get("prompt"), data.get("max_tokens")
        if not isinstance(prompt, str) or not prompt.strip():
            raise WorkloadError(f"{where}: field 'prompt' must be a non-empty string.", "Give the prompt's text.")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= 32768:
            raise WorkloadError(
                f"{where}: field 'max_tokens' must be an integer from 1 to 32768.", "Give the reply's length in tokens."
            )
        system = data.get("system")
        if system is not None and not isinstance(system, str):
            raise WorkloadError(f"{where}: field 'system' must be a string.", "Give a text, or leave the field out.")
        items.append(
            PromptItem(
                id=str(data.get("id", f"line-{number}")),
                category=str(data.get("category", "other")),
                prompt=prompt,
                max_tokens=max_tokens,
                system=system,
            )
        )
    if not items:
        raise WorkloadError(f"Prompt set {path} holds no prompts.", "Add one JSON object per line.")
    return items


def _messages(text: str, system: str | None = None) -> list[Message]:
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": text}]


class PromptSetWorkload:
    """The first n prompts of a set (cycled), each tagged; every level gets the same prompts in the same order."""

    def __init__(self, items: list[PromptItem], tagger: Tagger, output_len: int | None = None) -> None:
        self.items = items
        self.tagger = tagger
        self.output_len = output_len
        self.name = "prompts"

    async def take(self, n: int) -> list[BenchRequest]:
        chosen = [self.items[i % len(self.items)] for i in range(n)]
        return [
            BenchRequest(
                _messages(self.tagger.tag() + item.prompt, item.system),
                self.output_len or item.max_tokens,
                item.id,
            )
            for item in chosen
        ]


async def fit_words(measure: Callable[[int], Awaitable[int]], target: int, guess: int, most: int) -> int:
    """The largest k in [0, most] with measure(k) <= target (measure grows with k), searched from `guess`."""
    low, high = 0, most + 1  # measure(low) <= target, measure(high) > target (by assumption at the ends)
    k = max(1, min(guess, most))
    while high - low > 1:
        tokens = await measure(k)
        if tokens == target:
            return k
        if tokens < target:
            low = k
        else:
            high = k
        # Extrapolate from the tokens per word, but always land strictly inside (low, high).
        step = round((target - tokens) / ESTIMATED_TOKENS_PER_WORD) or (1 if tokens < target else -1)
        k = k + step if low < k + step < high else (low + high) // 2
    return low


async def pad_to(measure: Callable[[str], Awaitable[int]], text: str, target: int) -> str:
    """Append short endings to `text` while each brings the token count closer to `target` without passing it."""
    tokens = await measure(text)
    while tokens < target:
        for ending in PADDING:
            longer = await measure(text + ending)
            if tokens < longer <= target:
                text, tokens = text + ending, longer
                break
        else:
            break  # no ending fits: leave the prompt a token or two short
    return text


class SyntheticWorkload:
    """Random-word prompts of exactly `input_len` prompt tokens (chat template included) where the server counts."""

    def __init__(self, input_len: int, output_len: int, tagger: Tagger, count_tokens: CountTokens, seed: int = 0):
        self.input_len = input_len
        self.output_len = output_len
        self.tagger = tagger
        self.count_tokens = count_tokens
        self.rng = random.Random(seed)
        self.name = "synthetic"
        self._tokens_per_word = ESTIMATED_TOKENS_PER_WORD
        self._can_count = True

    async def _one(self) -> BenchRequest:
        tag = self.tagger.tag()
        most = self.input_len * 2
        words = self.rng.choices(WORDS, k=most)

        def text(k: int) -> str:
            return tag + " ".join(words[:k])

        guess = int(self.input_len / self._tokens_per_word)
        if self._can_count:
            probe = await self.count_tokens(_messages(text(guess)))
            if probe is None:
                self._can_count = False
                log.warning("The server cannot count tokens: synthetic prompt lengths are estimates.")
        if not self._can_count:
            return BenchRequest(_messages(text(guess)), self.output_len, "synthetic")

        async def tokens_of(content: str) -> int:
            return int(await self.count_tokens(_messages(content)) or 0)

        async def measure(k: int) -> int:
            return await tokens_of(text(k))

        k = await fit_words(measure, self.input_len, guess, most)
        if k:
            self._tokens_per_word = max(0.5, (await measure(k)) / k)
        content = await pad_to(tokens_of, text(k), self.input_len)
        return BenchRequest(_messages(content), self.output_len, "synthetic")

    async def take(self, n: int) -> list[BenchRequest]:
        return [await self._one() for _ in range(n)]
