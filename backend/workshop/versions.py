"""The history of every template file the workshop changes: who, when, a note and the whole text of each version.

Kept under the data folder (``<data_dir>/workshop/<file stem>/``) by one app process: ``history.json`` lists the
versions, and ``<number>.yaml`` holds each one's text (several processes keep them in the database instead:
backend.workshop.history). Every file is written whole to a temporary name and moved into place
(os.replace), so a crash never leaves half a file behind; the prompts folder itself stays the source of truth.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from backend.files import atomic_write

Action = Literal["created", "saved", "restored", "deleted", "found"]
ABSENT = "absent"  # the version tag of a file that does not exist


def version_tag(text: str | None) -> str:
    """A short tag of a file's text (its SHA-256, 16 hex digits); ABSENT when there is no file."""
    return ABSENT if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def unified_diff(old: str, new: str, old_label: str, new_label: str) -> str:
    """The changes from `old` to `new` as a unified diff (difflib), empty when they are the same."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), old_label, new_label, lineterm=""
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


@dataclass(frozen=True)
class Version:
    """One version of a template file: its number (1 is the oldest), its tag, who made it, when, why."""

    number: int
    tag: str
    who: str
    when: str  # ISO 8601, UTC
    note: str
    action: Action


class VersionStore:
    """The histories of the template files, one folder per file stem under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _folder(self, stem: str) -> Path:
        return self.root / stem

    def history(self, stem: str) -> list[Version]:
        """The versions of `stem`, oldest first ([] when the workshop never saw it)."""
        try:
            raw = json.loads((self._folder(stem) / "history.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        return [Version(**entry) for entry in raw]

    def latest(self, stem: str) -> Version | None:
        found = self.history(stem)
        return found[-1] if found else None

    def text(self, stem: str, number: int) -> str | None:
        """The text of version `number` of `stem` (None when it has none: unknown, or a deletion)."""
        try:
            return (self._folder(stem) / f"{number}.yaml").read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def record(self, stem: str, text: str | None, who: str, note: str, action: Action) -> Version:
        """Add a version (text None: the file was deleted); the text is in place before the history names it."""
        folder = self._folder(stem)
        folder.mkdir(parents=True, exist_ok=True)
        versions = self.history(stem)
        version = Version(len(versions) + 1, version_tag(text), who, now_utc(), note, action)
        if text is not None:
            atomic_write(folder / f"{version.number}.yaml", text)
        history = [asdict(v) for v in [*versions, version]]
        atomic_write(folder / "history.json", json.dumps(history, ensure_ascii=False, indent=1) + "\n")
        return version

    def note_outside_change(self, stem: str, text: str | None) -> Version | None:
        """Record the file as it is now when it differs from the last recorded version (an edit made outside
        the workshop, or a file the workshop never saw), so that every earlier state can be restored."""
        found = outside_change(self.latest(stem), text)
        return None if found is None else self.record(stem, text, OUTSIDE, *found)


OUTSIDE = "(outside the workshop)"  # who made a change the workshop did not make


def outside_change(latest: Version | None, text: str | None) -> tuple[str, Action] | None:
    """(note, action) of the version that records the file's `text` when it differs from the `latest` recorded
    one; None when there is nothing to record (the same text, or a file never seen and not there)."""
    if latest is not None and latest.tag == version_tag(text):
        return None
    if latest is None and text is None:
        return None
    note = "as found in the prompts folder" if latest is None else "changed outside the workshop"
    return note, "found" if text is not None else "deleted"


def now_utc() -> str:
    """The time of a new version: ISO 8601, UTC, whole seconds."""
    return datetime.now(UTC).isoformat(timespec="seconds")
