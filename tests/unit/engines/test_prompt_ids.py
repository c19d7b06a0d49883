"""The app's own prompt ids (backend.models.prompt_ids): the template rendered as transformers renders it, the ids
the tokenizer gives the whole text, each earlier turn tokenized once, and no ids where a folder cannot give them."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from backend.models.prompt_ids import SAMPLES, PromptIds

tokenizers = pytest.importorskip("tokenizers", reason="requirements.txt installs it (make setup)")
from tests import make_tiny_ernie  # noqa: E402  (the tests' tiny ERNIE: its byte-level BPE and chat template)

WORDS = "the of 我们 今天 model data\n code  é 👍 <s> </s> <|end_of_sentence|>x".split(" ")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    make_tiny_ernie.build_tokenizer(None).save(str(out / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": make_tiny_ernie.CHAT_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def conversation(rng: random.Random, turns: int) -> list[dict[str, str]]:
    out = [{"role": "system", "content": " ".join(rng.choices(WORDS, k=9))}] if rng.random() < 0.5 else []
    for _ in range(turns):
        out += [{"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randrange(0, 40)))},
                {"role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randrange(0, 60)))}]  # fmt: skip
    return [*out, {"role": "user", "content": " ".join(rng.choices(WORDS, k=12))}]


def test_the_ids_are_the_whole_rendered_texts_own(folder: Path) -> None:
    made = PromptIds.load(folder)
    assert made is not None and made.exact(SAMPLES)
    whole = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    rng = random.Random(7)
    for messages in [*SAMPLES, *(conversation(rng, rng.randrange(1, 12)) for _ in range(40))]:
        text = made.render(messages)
        assert made.ids(messages) == whole.encode(text, add_special_tokens=False).ids, text


def test_the_template_is_rendered_as_the_model_folder_says(folder: Path) -> None:
    made = PromptIds.load(folder)
    assert made is not None
    text = made.render([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}])
    assert text == "<|begin_of_sentence|>S\nUser: Q\nAssistant: "  # the tiny ERNIE's template, generation prompt added


class Counting:
    """The folder's tokenizer, counting the characters it was asked to encode."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.chars = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> Any:
        self.chars += len(text)
        return self.inner.encode(text, add_special_tokens=add_special_tokens)

    def get_added_tokens_decoder(self) -> Any:
        return self.inner.get_added_tokens_decoder()


def test_a_growing_chat_tokenizes_only_its_newest_turn(folder: Path) -> None:
    made = PromptIds.load(folder)
    assert made is not None
    counting = Counting(made.tokenizer)
    made.tokenizer = counting
    history = conversation(random.Random(3), 30)[:-1]
    first = made.ids([*history, {"role": "user", "content": "one"}])
    before = counting.chars
    second = made.ids([*history, {"role": "assistant", "content": "two"}, {"role": "user", "content": "three"}])
    end = made.marks["<|end_of_sentence|>"]  # the history's last reply ends with it
    kept = len(first) - first[::-1].index(end)
    assert second[:kept] == first[:kept]  # the history's ids, unchanged
    assert counting.chars - before < 60, "only the newest turn's text is encoded again"


class Neighbourly(Counting):
    """A tokenizer whose pieces are not the whole's: it adds a token at the start of every text it encodes."""

    def encode(self, text: str, add_special_tokens: bool = True) -> Any:
        ids = [0, *self.inner.encode(text, add_special_tokens=add_special_tokens).ids]
        return type("Encoding", (), {"ids": ids})()


def test_a_tokenizer_whose_pieces_differ_from_the_whole_encodes_whole_texts(folder: Path) -> None:
    made = PromptIds.load(folder)
    assert made is not None
    made.tokenizer = Neighbourly(made.tokenizer)
    assert not made.exact(SAMPLES)
    messages = SAMPLES[2]
    assert made.ids(messages) == made.tokenizer.encode(made.render(messages), add_special_tokens=False).ids


def test_no_ids_without_a_tokenizer_json_or_a_chat_template(folder: Path, tmp_path: Path) -> None:
    assert PromptIds.load(tmp_path) is None  # nothing there: a hub id, a GGUF file's folder
    (tmp_path / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    assert PromptIds.load(tmp_path) is None
