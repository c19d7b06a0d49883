"""The terms a passage is indexed by and a question is looked up with, in English and Chinese alike.

Text is folded (NFKC, case); a Latin word or number is one term; Chinese, which has no spaces, gives each pair of
neighbouring characters (a lone character gives itself). Pairs were measured against single characters and against
SQLite's trigram tokenizer (results/documents/): they need no dictionary, no model and nothing downloaded."""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

WORD = re.compile(r"[0-9a-z]+|[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
MAX_QUERY_TERMS = 64


def terms(text: str) -> list[str]:
    """The text's terms, in order, repeats kept."""
    found: list[str] = []
    for run in WORD.findall(unicodedata.normalize("NFKC", text).casefold()):
        if CJK.match(run):
            found += [run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)]
        else:
            found.append(run)
    return found


def term_counts(text: str) -> Counter[str]:
    """Each term of the text with how often it occurs (a passage's row of the index)."""
    return Counter(terms(text))


def query_terms(text: str) -> list[str]:
    """A question's distinct terms, at most MAX_QUERY_TERMS (the first ones)."""
    return list(dict.fromkeys(terms(text)))[:MAX_QUERY_TERMS]
