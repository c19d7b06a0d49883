"""Documents as context, as the chat turn sees them: the passages found for a message (Source), who finds them
(Finder: backend.documents.library), and how they are written into the message the model reads.

Where they go: into the user message of the turn, before the question, and the history keeps that message as the
model saw it. An engine caches a prompt by its beginning, so the next turn's prompt begins with everything this one
sent and the engine reads only the new message (results/documents/: the first text of a second question about the
same document). Passages put in the system text instead would change the prompt's beginning with every question."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from backend.chat.context import estimate_tokens

CJK = re.compile(r"[\u3400-\u9fff]")
# What the model is told around the passages, in the question's language (the demo model reads English only, ERNIE
# both): the numbers let it name them, and the app names them under the reply in any case.
LEAD = {
    "en": "Passages from the user's documents:",
    "zh": "以下是用户文档中的段落：",
}
ASK = {
    "en": "Answer the question from the passages above, and name the passage you used, like [1].\nQuestion: {question}",
    "zh": "请根据上面的段落回答问题，并注明所依据的段落，例如 [1]。\n问题：{question}",
}


@dataclass(frozen=True)
class Source:
    """A passage of the user's documents sent with a message: its number in the message ([1]), where it is from."""

    number: int
    document: str  # the file's name
    document_id: str
    passage: int  # its number in the document
    text: str
    page: int | None = None
    heading: str | None = None

    def saved(self) -> dict[str, Any]:
        """The source as kept in the reply's metadata (a reopened thread shows its sources again)."""
        return {"number": self.number, "document": self.document, "document_id": self.document_id,
                "passage": self.passage, "page": self.page, "heading": self.heading, "text": self.text}  # fmt: skip

    @classmethod
    def read(cls, saved: dict[str, Any]) -> Source:
        keys = ("number", "document", "document_id", "passage", "text", "page", "heading")
        return cls(**{key: saved.get(key) for key in keys})  # type: ignore[arg-type]


def user_owner(name: str) -> str:
    """Whose documents a login user's are (a library's owner; without login a browser tab is one: "tab:ID")."""
    return f"user:{name}"


class Finder(Protocol):
    """Finds the passages of an owner's documents that answer a question (backend.documents.library.Library)."""

    async def find(self, owner: str, question: str, count: int) -> list[Source]: ...


def language(text: str) -> str:
    """'zh' for a question with Chinese characters in it, else 'en'."""
    return "zh" if CJK.search(text) else "en"


def label(source: Source) -> str:
    """Where a passage is from, in a line: the file, then its page or heading."""
    where = f"p. {source.page}" if source.page is not None else (source.heading or "")
    return f"{source.document}, {where}" if where else source.document


def block(source: Source) -> str:
    """A passage as the model reads it: its number and where it is from, then its text."""
    return f"[{source.number}] {label(source)}\n{source.text}"


def with_sources(question: str, sources: list[Source]) -> str:
    """The user message the model reads: the passages, numbered, then the question (as the template wrote it)."""
    if not sources:
        return question
    lang = language(question)
    return "\n\n".join([LEAD[lang], *map(block, sources), ASK[lang].format(question=question)])


def asked(content: str) -> str:
    """The question of a user message with_sources wrote (its passages left out: an export shows what was asked, the
    reply's sources name the passages); any other message as it is. The history keeps the message whole, as the
    model saw it, so that the next turn's prompt begins as this one's did (the engine's cache)."""
    for lang, lead in LEAD.items():
        ask = ASK[lang].split("{question}")[0]
        at = content.rfind(ask)
        if content.startswith(lead + "\n\n") and at >= 0:
            return content[at + len(ask) :]
    return content


def within(sources: list[Source], room: int) -> list[Source]:
    """The best passages (they come best first) that fit `room` tokens together, by the conservative estimate
    (backend.chat.context.estimate_tokens: the engine is not asked; the fitting that follows counts exactly)."""
    kept: list[Source] = []
    used = 0
    for source in sources:
        used += estimate_tokens([{"role": "user", "content": block(source)}])
        if used > room:
            break
        kept.append(source)
    return kept
