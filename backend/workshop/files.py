"""The prompts folder as the workshop changes it: save, create, duplicate, delete and restore template files.

Every change is checked first (a draft with problems is refused: the file keeps its text, or a new one is not
written), compared with the version the editor started from (someone else's newer save is a conflict, never
overwritten), written atomically, and recorded in the history (backend.workshop.history: the data folder's files for
one app process, the database for several). The chat's TemplateStore
notices the new file on its next message: nothing is restarted.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from backend.errors import WorkshopError
from backend.files import atomic_write
from backend.prompts.schema import DEFAULT_NAME, TemplateProblem, display_path
from backend.workshop.drafts import draft_folder, template_files, valid_stem
from backend.workshop.history import History
from backend.workshop.versions import ABSENT, OUTSIDE, Action, Version, version_tag

_NAME_LINE = re.compile(r"^name:.*$", re.MULTILINE)


class DraftRefused(WorkshopError):
    """A draft with problems was not saved; `problems` are the ones check-prompts would print."""

    problems: list[TemplateProblem]


class TemplateFiles:
    """The template files of one folder, changed one at a time: the history's lock (shared by every app process
    that shares the history) spans check, compare, write and record."""

    def __init__(self, folder: Path, history: History) -> None:
        self.folder = folder
        self.history = history

    def path(self, stem: str) -> Path:
        """The file of `stem` (writing -> prompts/writing.yaml, or the .yml file that exists)."""
        if not valid_stem(stem):
            raise WorkshopError.of("workshop.bad_name", name=stem)
        return template_files(self.folder).get(stem, self.folder / f"{stem}.yaml")

    def read(self, stem: str) -> str | None:
        """The file's text now, or None when there is no such file."""
        try:
            return self.path(stem).read_bytes().decode("utf-8", "replace")
        except FileNotFoundError:
            return None

    def current(self, stem: str) -> tuple[str, str]:
        """(text, version tag) of an existing file, else WorkshopError not_found."""
        text = self.read(stem)
        if text is None:
            raise WorkshopError.of("workshop.not_found", name=stem)
        return text, version_tag(text)

    # ----- changes ------------------------------------------------------------------------------------------
    async def save(self, stem: str, text: str, base: str, who: str, note: str = "") -> Version:
        """Replace the file's text; `base` is the version tag the editor started from (ABSENT for a new file)."""
        async with self.history.exclusive():
            return await self._write(stem, text, base, who, note, "saved" if base != ABSENT else "created")

    async def create(self, stem: str, text: str, who: str, note: str = "") -> Version:
        """A new template file; refused when one of that name exists."""
        async with self.history.exclusive():
            if self.read(stem) is not None:
                raise WorkshopError.of("workshop.exists", name=stem)
            return await self._write(stem, text, ABSENT, who, note, "created")

    async def duplicate(self, stem: str, new_stem: str, who: str) -> Version:
        """A copy of `stem` as `new_stem`, its name line changed to the new name."""
        text, _ = self.current(stem)
        copied = _NAME_LINE.sub(f"name: {new_stem}", text, count=1)
        return await self.create(new_stem, copied, who, f"copy of {stem}")

    async def restore(self, stem: str, number: int, base: str, who: str) -> Version:
        """Make version `number` the current text again (checked like any save; a new version records it)."""
        text = await self.history.text(stem, number)
        if text is None:
            raise WorkshopError.of("workshop.no_version", name=stem, version=number)
        async with self.history.exclusive():
            return await self._write(stem, text, base, who, f"restored version {number}", "restored")

    async def delete(self, stem: str, base: str, who: str) -> Version:
        """Remove the file (its history stays: it can be restored); the default template is kept."""
        if stem == DEFAULT_NAME:
            raise WorkshopError.of("workshop.keep_default")
        async with self.history.exclusive():
            current = await self._unchanged_since(stem, base)
            if current is None:
                raise WorkshopError.of("workshop.not_found", name=stem)
            await self.history.note_outside_change(stem, current)
            try:
                self.path(stem).unlink()
            except OSError as exc:
                raise WorkshopError.of("workshop.write_failed", path=self.path(stem), reason=exc.strerror) from exc
            return await self.history.record(stem, None, who, "deleted", "deleted")

    # ----- the steps of every change --------------------------------------------------------------------------
    async def _unchanged_since(self, stem: str, base: str) -> str | None:
        """The file's text, after making sure it is still the version `base`; else a conflict naming who changed it."""
        current = self.read(stem)
        if version_tag(current) == base:
            return current
        latest = await self.history.latest(stem)
        if latest is not None and latest.tag == version_tag(current):
            who, when = latest.who, latest.when
        else:  # changed by hand on the server (or removed): the file's own time is all there is
            who, when = OUTSIDE, self._file_time(stem)
        raise WorkshopError.of("workshop.conflict", name=stem, who=who, when=when)

    def _file_time(self, stem: str) -> str:
        try:
            stamp = self.path(stem).stat().st_mtime
        except OSError:
            return "-"
        return datetime.fromtimestamp(stamp, UTC).isoformat(timespec="seconds")

    async def _write(self, stem: str, text: str, base: str, who: str, note: str, action: Action) -> Version:
        current = await self._unchanged_since(stem, base)
        with draft_folder(self.folder, stem, text) as check:
            if check.problems:
                # Only an existing file has a text that goes on serving; a new one is simply not there yet.
                code = "workshop.problems" if current is not None else "workshop.problems_new"
                refused = DraftRefused.of(code, count=len(check.problems), file=display_path(self.path(stem)))
                refused.problems = check.problems
                raise refused
        await self.history.note_outside_change(stem, current)
        path = self.path(stem)
        try:
            atomic_write(path, text)
        except OSError as exc:
            raise WorkshopError.of("workshop.write_failed", path=path, reason=exc.strerror) from exc
        return await self.history.record(stem, text, who, note, action)
