"""The templates of one folder, re-read when a file changes; a broken file never stops the chat.

A file with problems keeps its last good version serving, and the problems are listed for the chat and for
``python -m backend check-prompts [FOLDER]``.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from backend.errors import InvalidInputError, render
from backend.prompts.routing import command, pick
from backend.prompts.schema import (
    AUTO,
    DEFAULT_NAME,
    MAX_FILE_BYTES,
    FileProblems,
    Reason,
    RenderedPrompt,
    Template,
    TemplateProblem,
    display_path,
    parse_template,
)

logger = logging.getLogger(__name__)

SUFFIXES = (".yaml", ".yml")


class UnknownTemplate(InvalidInputError, ValueError):
    """An explicitly chosen template name that does not exist (the chat shows it as a refused message)."""

    code = "input.unknown_template"

    def __init__(self, name: str, known: list[str]) -> None:
        params = {"name": name, "known": ", ".join(known)}
        super().__init__(*render("input.unknown_template", "en", params), **params)
        self.name, self.known = name, known


BUILTIN_DEFAULT = Template(
    name=DEFAULT_NAME, description="Pass the message through unchanged", path="(built-in)", user="{input}"
)


@dataclass
class _FileState:
    stamp: tuple[int, int, int]  # (mtime_ns, size, inode): a change of any means "read it again"
    good: Template | None = None  # the last version without problems, kept while the file is broken
    problems: list[TemplateProblem] = field(default_factory=list)


class TemplateStore:
    """The templates of one folder, re-read when files change; never raises on a broken file."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._files: dict[Path, _FileState] = {}
        self._templates: dict[str, Template] = {}
        self._problems: list[TemplateProblem] = []
        self._lock = threading.Lock()
        self.refresh()

    def refresh(self) -> None:
        """Re-read new and changed files and forget deleted ones; one stat per file when nothing changed."""
        with self._lock:
            entries = self._scan()
            changed = entries is None or entries.keys() != self._files.keys() or not self._templates
            for path in [path for path in self._files if entries is None or path not in entries]:
                logger.info("prompt template file %s is gone", path)
                del self._files[path]
            for path, stat in (entries or {}).items():
                stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
                state = self._files.get(path)
                if state is None or state.stamp != stamp:
                    self._files[path] = self._load(path, stat.st_size, stamp, state)
                    changed = True
            if changed:
                self._assemble(folder_found=entries is not None)

    def _scan(self) -> dict[Path, os.stat_result] | None:
        try:
            with os.scandir(self.folder) as listing:
                candidates = [e for e in listing if e.name.endswith(SUFFIXES) and not e.name.startswith(".")]
        except OSError:
            return None
        found = {}
        for entry in candidates:
            try:  # a file may vanish between listing and stat; then it is simply not there
                if entry.is_file():
                    found[Path(entry.path)] = entry.stat()
            except OSError:
                continue
        return found

    def _load(self, path: Path, size: int, stamp: tuple[int, int, int], old: _FileState | None) -> _FileState:
        state = _FileState(stamp, good=old.good if old else None)
        shown = display_path(path)
        too_large = f"the file is too large; a template file may be at most {MAX_FILE_BYTES // 1024} KB"
        try:
            if size > MAX_FILE_BYTES:  # checked before reading: a huge file is a mistake, not a template
                raise FileProblems([TemplateProblem(shown, None, None, f"{too_large} (this one is {size // 1024} KB)")])
            with path.open("rb") as handle:
                data = handle.read(MAX_FILE_BYTES + 1)  # the file may have grown since the stat
            if len(data) > MAX_FILE_BYTES:
                raise FileProblems([TemplateProblem(shown, None, None, too_large)])
            state.good = parse_template(path, data)
            logger.info("loaded prompt template %r from %s", state.good.name, path)
        except FileProblems as exc:
            state.problems = exc.problems
        except OSError as exc:
            state.problems = [TemplateProblem(shown, None, None, f"cannot be read ({exc.strerror})")]
        return state

    def _assemble(self, folder_found: bool) -> None:
        before = set(self._problems)
        problems = [problem for state in self._files.values() for problem in state.problems]
        owners = {template.name: template.path for template in self._templates.values()}
        templates: dict[str, Template] = {}
        # A name stays with the file that already had it; then files in name order, so a copied file
        # that still carries the original's name is the one reported.
        candidates = [state.good for state in self._files.values() if state.good is not None]
        candidates.sort(key=lambda t: (owners.get(t.name) != t.path, t.path))
        for template in candidates:
            if template.name in templates:
                other = templates[template.name].path
                message = f'"{template.name}" is already used by {other}; every template needs its own name'
                problems.append(TemplateProblem(template.path, template.name_line, "name", message))
            else:
                templates[template.name] = template
        folder = display_path(self.folder)
        if not folder_found:
            message = "the prompt folder does not exist; using the built-in default (messages are sent unchanged)"
            problems.append(TemplateProblem(folder, None, None, message))
        elif DEFAULT_NAME not in templates:
            message = f'no usable "{DEFAULT_NAME}" template; using the built-in one (messages are sent unchanged)'
            problems.append(TemplateProblem(folder, None, None, message))
        templates.setdefault(DEFAULT_NAME, BUILTIN_DEFAULT)
        self._templates = templates
        self._problems = sorted(problems, key=lambda p: (p.path, p.line or 0, p.field or ""))
        for problem in self._problems:
            if problem not in before:
                logger.warning("prompt template problem: %s", problem)

    def snapshot(self) -> Templates:
        """The templates and problems as they are now (changed files read again first): what one turn decides with."""
        self.refresh()
        with self._lock:
            return Templates(dict(self._templates), tuple(self._problems))

    def names(self) -> list[str]:
        """Template names in routing order: highest priority first, the default last."""
        return self.snapshot().names()

    def describe(self) -> list[tuple[str, str]]:
        """(name, description) pairs in routing order, for a selector or a help message."""
        return self.snapshot().describe()

    def problems(self) -> list[TemplateProblem]:
        """Current problems in the folder, after re-reading changed files."""
        return list(self.snapshot().problems)

    def get(self, name: str) -> Template:
        """The template called name, or UnknownTemplate."""
        return self.snapshot().get(name)

    def route(self, message: str, explicit: str | None = None, demo: bool = False) -> RenderedPrompt:
        """Render the message with the chosen template, or the first one whose rules match it (Templates.route)."""
        return self.snapshot().route(message, explicit, demo)

    def split_command(self, message: str) -> tuple[str | None, str]:
        """Split "/name rest" into (name, rest) when name is a template; otherwise (None, message)."""
        return self.snapshot().split_command(message)


@dataclass(frozen=True)
class Templates:
    """The folder's templates and problems as read at one moment (TemplateStore.snapshot): a chat turn reads the
    folder once and decides with this."""

    by_name: dict[str, Template]
    problems: tuple[TemplateProblem, ...] = ()

    def ordered(self) -> list[Template]:
        """The templates in routing order: highest priority first, the default last."""
        rest = [t for t in self.by_name.values() if t.name != DEFAULT_NAME]
        return [*sorted(rest, key=lambda t: (-t.priority, t.name)), self.by_name[DEFAULT_NAME]]

    def names(self) -> list[str]:
        """Template names in routing order."""
        return [template.name for template in self.ordered()]

    def describe(self) -> list[tuple[str, str]]:
        """(name, description) pairs in routing order, for a selector or a help message."""
        return [(template.name, template.description) for template in self.ordered()]

    def get(self, name: str) -> Template:
        """The template called name, or UnknownTemplate."""
        template = self.by_name.get(name)
        if template is None:
            raise UnknownTemplate(name, self.names())
        return template

    def route(self, message: str, explicit: str | None = None, demo: bool = False) -> RenderedPrompt:
        """Render the message with the chosen template, or the first one whose rules match it.

        With `demo` (the offline demo model answers) routing skips the templates whose route_on_demo is false; when
        one of them matched first and the message falls through to the default, the reason names it."""
        if explicit and explicit != AUTO:
            return self.get(explicit).render(message, Reason(Reason.CHOSEN))
        ordered = self.ordered()
        picked = pick(ordered, message)
        if not demo or picked.template == DEFAULT_NAME or self.by_name[picked.template].route_on_demo:
            return picked
        skipped = picked.template
        picked = pick([t for t in ordered[:-1] if t.route_on_demo] + ordered[-1:], message)
        return replace(picked, reason=Reason(Reason.DEMO_OFF, skipped)) if picked.template == DEFAULT_NAME else picked

    def split_command(self, message: str) -> tuple[str | None, str]:
        """Split "/name rest" into (name, rest) when name is a template; otherwise (None, message)."""
        found = command(message)
        if found is None:
            return None, message
        return found if found[0] in self.by_name else (None, message)


def check_folder(folder: str | Path) -> int:
    """`check-prompts`: check a folder of templates; print each problem and return 1, or "N templates OK" and 0."""
    quiet = logging.NullHandler()  # the problems are printed below; don't print them twice via logging
    logger.addHandler(quiet)
    try:
        store = TemplateStore(folder)
    finally:
        logger.removeHandler(quiet)
    problems, names = store.problems(), store.names()
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} problem(s) found in {folder}; usable templates: {', '.join(names)}")
        return 1
    print(f"{len(names)} templates OK: {', '.join(names)}")
    return 0
