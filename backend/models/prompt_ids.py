"""A conversation's prompt as the model's own token ids, made in the app: its chat template and its tokenizer.

vLLM's API server renders the chat template and tokenizes each chat request itself, in one renderer thread: at 16
users a wave of prompts waits there in line, and a long chat's whole history is rendered and tokenized again at
every message (results/gpu-h100/README.md). A prompt sent as token ids (/v1/completions with `prompt` a list of
ids) skips both. Here the template is rendered as transformers' `apply_chat_template` renders it (jinja2's sandbox,
trim_blocks and lstrip_blocks, the tokenizer's special tokens as variables) and tokenized with the model folder's
tokenizer.json (the `tokenizers` library, which the engine's fast tokenizer is), without added special tokens, as
vLLM tokenizes a rendered chat.

The tokenizer splits its input at its special tokens before anything else, and encodes the text between them on
its own; so does `ids`, keeping each piece's ids: a chat's earlier turns (each a piece between the template's
markers) are tokenized once, and each message costs only its own turn. `exact` checks that the pieces give what
the whole text gives; where they do not (a tokenizer whose pieces depend on their neighbours), the whole text is
encoded each time.

Whether the ids are the engine's is not assumed: the chat sends ids only after they matched the engine's own
rendering of a few conversations (ChatService.warm_up), so what the answer check proved of the engine's rendering
holds for this path too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

Message = dict[str, str]
PIECES_KEPT = 4096  # tokenized pieces kept (a piece is about one turn of a conversation)
# Conversations whose ids must equal the engine's own rendering before prompts go as ids: a system text, turns,
# English and Chinese, line breaks and markup, emoji, a message that is empty.
SAMPLES: list[list[Message]] = [
    [{"role": "user", "content": "Hello! How are you today?"}],
    [{"role": "system", "content": "你是一个乐于助人的助手。"}, {"role": "user", "content": "用一句话介绍长江。"}],
    [
        {"role": "user", "content": "Write `print(1)` in Python:\n\n```python\n```"},
        {"role": "assistant", "content": "```python\nprint(1)\n```\n\nDone 👍"},
        {"role": "user", "content": "  Thanks —  and in 中文？\t"},
    ],
    [{"role": "user", "content": ""}],
]
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def _content(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an added token's {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    """The folder's default chat template: chat_template.jinja, else tokenizer_config.json's (one or named)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


class PromptIds:
    """The chat template and tokenizer of one model folder: `ids(messages)` is the prompt the engine would make."""

    def __init__(self, tokenizer: Any, template: str, variables: dict[str, str], folder: str = "") -> None:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self.folder = folder
        self.tokenizer = tokenizer
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.template = env.from_string(template)
        self.variables = variables
        # The special tokens the tokenizer splits its input at, and nothing else takes part in (no stripping of
        # the spaces around them, not matched inside words): the pieces between them are encoded on their own.
        added = tokenizer.get_added_tokens_decoder()
        marks = {
            t.content: i
            for i, t in added.items()
            if t.special and not (t.lstrip or t.rstrip or t.single_word) and t.content
        }
        self.marks = marks
        alternatives = "|".join(re.escape(m) for m in sorted(marks, key=len, reverse=True))
        self.split = re.compile(f"({alternatives})") if marks else None
        self.pieces: OrderedDict[str, list[int]] = OrderedDict()
        self.segmented = self.split is not None

    @classmethod
    def load(cls, folder: Path) -> PromptIds | None:
        """The folder's template and tokenizer; None where it has no tokenizer.json or no chat template, or the
        `tokenizers` library is not installed (the chat then sends messages, as before)."""
        try:
            from tokenizers import Tokenizer
        except ImportError:
            log.info("Prompts go to the engine as messages: the `tokenizers` library is not installed here.")
            return None
        if not (folder / "tokenizer.json").is_file():
            return None  # a hub id, a GGUF file's folder, a SentencePiece model only
        try:
            config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
            tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except (OSError, ValueError, Exception) as exc:  # the library raises its own Exception for a bad file
            log.info("Prompts go to the engine as messages: %s has no usable tokenizer (%s).", folder, exc)
            return None
        template = chat_template(folder, config)
        if template is None:
            log.info("Prompts go to the engine as messages: %s has no chat template.", folder)
            return None
        variables = {k: v for k in SPECIAL_KEYS if (v := _content(config.get(k))) is not None}
        return cls(tokenizer, template, variables, str(folder))

    def render(self, messages: list[Message]) -> str:
        """The prompt's text: the template applied, the generation prompt added."""
        return self.template.render(messages=messages, add_generation_prompt=True, tools=None, documents=None,
                                    **self.variables)  # fmt: skip

    def ids(self, messages: list[Message]) -> list[int]:
        """The prompt's token ids (the pieces between special tokens from the cache where already tokenized)."""
        return self.encode(self.render(messages))

    def encode(self, text: str) -> list[int]:
        if not self.segmented or self.split is None:
            return list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        out: list[int] = []
        for piece in self.split.split(text):
            if not piece:
                continue
            mark = self.marks.get(piece)
            if mark is not None:
                out.append(mark)
                continue
            ids = self.pieces.get(piece)
            if ids is None:
                ids = list(self.tokenizer.encode(piece, add_special_tokens=False).ids)
                self.pieces[piece] = ids
                if len(self.pieces) > PIECES_KEPT:
                    self.pieces.popitem(last=False)
            else:
                self.pieces.move_to_end(piece)
            out += ids
        return out

    def exact(self, samples: list[list[Message]]) -> bool:
        """Whether the pieces encode as the whole text does for `samples`; if not, whole texts are encoded."""
        for messages in samples:
            text = self.render(messages)
            whole = list(self.tokenizer.encode(text, add_special_tokens=False).ids)
            if self.encode(text) != whole:
                log.info(
                    "The tokenizer of %s encodes pieces unlike the whole text: whole prompts are encoded.", self.folder
                )
                self.segmented = False
                self.pieces.clear()
                return False
        return True


async def verified(
    folder: Path, engine_ids: Callable[[list[Message]], Awaitable[list[int] | None]]
) -> PromptIds | None:
    """The folder's PromptIds where they give the engine's own ids (`engine_ids`: its rendering) for every sample
    conversation; None otherwise (said in the log)."""
    made = await asyncio.to_thread(PromptIds.load, folder)
    if made is None:
        return None
    await asyncio.to_thread(made.exact, SAMPLES)
    for messages in SAMPLES:
        ours, theirs = made.ids(messages), await engine_ids(messages)
        if ours != theirs:
            log.warning(
                "Prompts go to the engine as messages: its rendering of a sample differs from the template and "
                "tokenizer of %s (%s tokens against %s).", folder, len(ours), theirs and len(theirs),
            )  # fmt: skip
            return None
    return made


def _raise(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)
