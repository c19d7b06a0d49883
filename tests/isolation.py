"""Markers that tell conversations apart, and the check that finds one conversation's marker in another's text."""

from __future__ import annotations

import re
import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass, field

PREFIX = "ZQ"
ALPHABET = string.ascii_uppercase + string.digits
# Spaces, hyphens, quotes and case are dropped before searching: "zq-4k8p lm" still shows marker ZQ4K8PLM.
NOT_ALNUM = re.compile(r"[^0-9A-Z]")


@dataclass
class Transcript:
    """One conversation as the test saw it: its marker, the replies it got, the history it saved."""

    marker: str
    replies: list[str] = field(default_factory=list)
    history: list[Mapping[str, object]] = field(default_factory=list)  # what the model is sent next time

    def texts(self) -> list[tuple[str, str]]:
        """(where, text) for every reply and every saved message."""
        replies = [(f"reply {n}", text) for n, text in enumerate(self.replies, 1)]
        saved = [(f"saved {m['role']} message {n}", str(m["content"])) for n, m in enumerate(self.history, 1)]
        return replies + saved


def new_markers(count: int, length: int = 6) -> list[str]:
    """`count` distinct random markers (ZQ + `length` uppercase letters or digits), new on every call."""
    markers: set[str] = set()
    while len(markers) < count:
        markers.add(PREFIX + "".join(secrets.choice(ALPHABET) for _ in range(length)))
    return sorted(markers)


def normalized(text: str) -> str:
    """The text's letters and digits only, in upper case."""
    return NOT_ALNUM.sub("", text.upper())


def shows(text: str, marker: str) -> bool:
    """Whether `marker` appears in `text`, whatever the case and the separators between its characters."""
    return normalized(marker) in normalized(text)


def foreign_markers(text: str, own: str, markers: list[str]) -> list[str]:
    """The markers other than `own` that appear in `text` (another conversation's content: a leak)."""
    return [marker for marker in markers if marker != own and shows(text, marker)]


def leaks(transcripts: list[Transcript]) -> list[str]:
    """One line for each reply or saved message that shows another conversation's marker."""
    markers = [t.marker for t in transcripts]
    found = []
    for n, transcript in enumerate(transcripts):
        for where, text in transcript.texts():
            for marker in foreign_markers(text, transcript.marker, markers):
                whose = markers.index(marker)
                found.append(f"conversation {n}: {where} shows {marker} (conversation {whose}): {text!r}")
    return found
