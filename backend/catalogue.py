"""The one catalogue of the words a user reads, kept as data in backend/catalogue.yaml and read once, at import.

code -> English and Simplified Chinese text: the errors (message and hint, with the values they take), the phrases
an error takes as a value, and the chat window's own words. The code that formats them lives elsewhere
(backend.errors for errors and phrases, backend.chat.i18n for the chat). This module is the bottom layer: it
imports nothing from backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

LANGUAGES = ("en", "zh")
FILE = Path(__file__).with_name("catalogue.yaml")


def lang_of(locale: str | None) -> str:
    """Map a browser locale such as 'zh-CN' or 'en-US' (or a bare 'zh', 'en') to one of LANGUAGES."""
    return "zh" if (locale or "").lower().startswith("zh") else "en"


@dataclass(frozen=True)
class Entry:
    """One catalogued error: the parameters its texts use, and its (message, hint) in each language."""

    params: tuple[str, ...]
    en: tuple[str, str]
    zh: tuple[str, str]

    def __getitem__(self, lang: str) -> tuple[str, str]:
        return self.zh if lang == "zh" else self.en


@dataclass(frozen=True)
class PhraseEntry:
    """One catalogued part of a sentence: the parameters it uses, and its text in each language."""

    params: tuple[str, ...]
    en: str
    zh: str

    def __getitem__(self, lang: str) -> str:
        return self.zh if lang == "zh" else self.en


def _texts(entry: dict[str, Any], lang: str) -> tuple[str, str]:
    return str(entry[lang]["message"]), str(entry[lang]["hint"])


def load(path: Path = FILE) -> tuple[dict[str, Entry], dict[str, PhraseEntry], dict[str, dict[str, str]]]:
    """The catalogue file's errors, phrases and chat texts."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C parser where PyYAML has it: ~10x faster
    data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
    errors = {code: Entry(tuple(e["params"]), _texts(e, "en"), _texts(e, "zh")) for code, e in data["errors"].items()}
    phrases = {code: PhraseEntry(tuple(p["params"]), str(p["en"]), str(p["zh"])) for code, p in data["phrases"].items()}
    chat = {key: {lang: str(text) for lang, text in texts.items()} for key, texts in data["chat"].items()}
    return errors, phrases, chat


#: code -> an error's parameters and its (message, hint) in each language. Codes are stable: tests, metrics and
#: translations refer to them.
#: code -> a part of a sentence given as a parameter (backend.errors.Phrase).
#: key -> the chat window's own words (backend.chat.i18n.t).
CATALOG, PHRASES, MESSAGES = load()
