"""A document's sections cut into passages of about `size` characters, the unit that is found and sent to the model.

A passage ends at a paragraph's end where one is near, else at a sentence's (. ! ? and 。！？；), else at a space;
a passage keeps the page and heading of its section, and its heading is written at its head, so a passage found
alone still says what it is about. Sizes were measured (results/documents/)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from backend.documents.extract import Section

SENTENCE_END = re.compile(r"(?<=[.!?。！？；;])\s*|\n")


@dataclass(frozen=True)
class Passage:
    """One passage of a document: its number in the document (from 0), where it is, its text."""

    number: int
    text: str
    page: int | None = None
    heading: str | None = None


def _cut(text: str, size: int) -> list[str]:
    """`text` in pieces of at most `size` characters, each ending at the latest paragraph, sentence or word end
    that is past half the size (a piece with none is cut at `size`)."""
    pieces: list[str] = []
    rest = text.strip()
    while len(rest) > size:
        window = rest[: size + 1]
        at = window.rfind("\n\n", size // 2)
        if at < 0:
            ends = [m.end() for m in SENTENCE_END.finditer(window) if size // 2 <= m.end() <= size]
            at = ends[-1] if ends else window.rfind(" ", size // 2)
        if at <= 0:
            at = size
        pieces.append(rest[:at].strip())
        rest = rest[at:].strip()
    if rest:
        pieces.append(rest)
    return [piece for piece in pieces if piece]


def passages(sections: list[Section], size: int) -> list[Passage]:
    """The sections' text as passages of at most about `size` characters (a heading adds its own length)."""
    out: list[Passage] = []
    for section in sections:
        for piece in _cut(section.text, size):
            text = f"{section.heading}\n{piece}" if section.heading else piece
            out.append(Passage(len(out), text, section.page, section.heading))
    return out
