"""An unsaved template (a draft): checked, previewed and tried exactly as the chat would use it once saved.

A draft is judged in the company of the folder's other templates: the draft and copies of the other files are put
in a temporary folder and read by the same TemplateStore the chat uses (backend.prompts.store), so the problems are
the very messages `check-prompts` prints (a clash of names included), and a sample message is decided and built by
the chat's own ChatService.decide and build_request. Nothing here writes to the prompts folder.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from backend.chat.request import ChatRequest, UserSettings, clean_input
from backend.chat.service import ChatService
from backend.errors import ServiceError
from backend.prompts.routing import request_parts
from backend.prompts.schema import NAME_PATTERN, Template, TemplateFile, TemplateProblem, display_path
from backend.prompts.store import SUFFIXES, TemplateStore

FIELDS = tuple(TemplateFile.model_fields)  # the template file's fields, in the order the schema lists them
FILE_STEM = re.compile(NAME_PATTERN)

# The temporary stores read the draft on every keystroke: their "loaded"/"problem" lines would flood the app's log.
_QUIET = contextvars.ContextVar("workshop_quiet", default=False)


class _QuietFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _QUIET.get()


logging.getLogger("backend.prompts.store").addFilter(_QuietFilter())


# ----- the two views of a draft: YAML text and form fields ------------------------------------------------------
class _Dumper(yaml.SafeDumper):
    """Writes text with line breaks as "|" blocks, as people write templates by hand."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _text)


def form_yaml(fields: dict[str, Any], header: str = "") -> str:
    """The YAML text of a template given as form fields (empty fields left out, the schema's order kept), after
    `header` (the comment lines the file starts with: the form has no place for them, and they are kept)."""
    kept = {key: value for key, value in fields.items() if value not in (None, "", [], {})}
    ordered = {key: kept.pop(key) for key in FIELDS if key in kept} | kept  # unknown keys last: the check names them
    return header + yaml.dump(ordered, Dumper=_Dumper, allow_unicode=True, sort_keys=False, width=1000)


def leading_comments(text: str | None) -> str:
    """The comment (and blank) lines at the top of a template file, as they are."""
    lines = (text or "").splitlines(keepends=True)
    count = next((i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")), len(lines))
    return "".join(lines[:count]).lstrip("\n")


def yaml_fields(text: str) -> dict[str, Any] | None:
    """The fields of a template's YAML text for the form, or None when the text is not a YAML mapping."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    return raw if isinstance(raw, dict) else None


# ----- the folder's template files -----------------------------------------------------------------------------
def template_files(folder: Path) -> dict[str, Path]:
    """The folder's template files by stem (writing.yaml -> "writing"), the ones the store reads."""
    try:
        paths = sorted(p for p in folder.iterdir() if p.name.endswith(SUFFIXES) and not p.name.startswith("."))
    except OSError:
        return {}
    found: dict[str, Path] = {}
    for path in paths:
        if path.is_file():
            found.setdefault(path.stem, path)
    return found


def problem_json(problem: TemplateProblem) -> dict[str, Any]:
    """A problem as the page shows it: where, and the line check-prompts prints."""
    return {"file": problem.path, "line": problem.line, "field": problem.field, "message": problem.message,
            "text": str(problem)}  # fmt: skip


@dataclass
class DraftCheck:
    """A draft read in the company of the other templates: the store holding both, and what is wrong with it."""

    store: TemplateStore
    template: Template | None  # the draft as the chat would load it; None while it has problems
    problems: list[TemplateProblem]


@contextlib.contextmanager
def draft_folder(folder: Path, stem: str, text: str | None) -> Iterator[DraftCheck]:
    """The prompts folder with `text` in place of the file `stem` (or without it, for None), for as long as the
    block runs. Paths in problems are the real folder's, as check-prompts shows them."""
    files = template_files(folder)
    target = files.get(stem, folder / f"{stem}.yaml")
    token = _QUIET.set(True)
    try:
        with tempfile.TemporaryDirectory(prefix="workshop-") as tmp:
            root = Path(tmp)
            for other, path in files.items():
                if other != stem:
                    shutil.copyfile(path, root / path.name)
            # The others first, then the draft: a name clash is the draft's problem, as in the running chat,
            # where a name stays with the file that already had it.
            store = TemplateStore(root)
            if text is not None:
                (root / target.name).write_bytes(text.encode("utf-8"))
                store.refresh()
            inside, shown = display_path(root / target.name), display_path(target)

            def moved(problem: TemplateProblem) -> TemplateProblem:
                message = problem.message.replace(display_path(root) + "/", display_path(folder) + "/")
                return replace(problem, path=shown, message=message)

            problems = [moved(p) for p in store.problems() if p.path == inside]
            template = None
            if text is not None and not problems:
                template = next((t for t in map(store.get, store.names()) if t.path == inside), None)
            yield DraftCheck(store, template, problems)
    finally:
        _QUIET.reset(token)


# ----- preview: what the chat would do with a message ----------------------------------------------------------
def chat_view(service: ChatService, store: TemplateStore) -> ChatService:
    """The chat service as it would be with `store`'s templates: the same engine, the same one client."""
    return service.with_templates(store)


def chat_settings(service: ChatService) -> UserSettings:
    """The settings a new chat starts with on the model that serves now (template: auto)."""
    return UserSettings.defaults(service.cfg, service.serving_demo)


def routing(service: ChatService, store: TemplateStore, draft: Template | None, message: str) -> dict[str, Any]:
    """Which template a new chat picks for `message` and why (the chat's own decision, ChatService.decide, on the
    model that serves now), and every template's own verdict in routing order, so a draft that matches but loses to
    one earlier in the order, or does not route on the demo model, is visible."""
    decision = chat_view(service, store).decide(message, chat_settings(service))
    parts = request_parts(message)
    candidates = []
    for name in store.names():
        template = store.get(name)
        reason = next((r for part in parts if (r := template.match(part))), None)
        is_draft = draft is not None and template.path == draft.path
        shown = reason.saved() if reason else None
        candidates.append({"name": name, "priority": template.priority, "reason": shown, "draft": is_draft,
                           "route_on_demo": template.route_on_demo})  # fmt: skip
    mine = next((c for c in candidates if c["draft"]), None)
    if draft is None or mine is None:
        outcome = "no_draft"
    elif decision.template == draft.name:
        outcome = "draft"
    elif mine["reason"] and decision.demo and not draft.route_on_demo:
        outcome = "demo_off"  # the draft matches, but the demo model answers and the draft does not route on it
    elif mine["reason"]:
        outcome = "other_first"  # the draft matches, but a template earlier in routing order matched too
    else:
        outcome = "no_match"
    return {"picked": decision.template, "reason": decision.reason.saved(), "outcome": outcome,
            "candidates": candidates, "demo": decision.demo}  # fmt: skip


def request_json(request: ChatRequest) -> dict[str, Any]:
    """The request as the engine gets it: template and why, system and user text, sampling, all messages."""
    first = request.messages[0] if request.messages else None
    system = first["content"] if first is not None and first["role"] == "system" else None
    return {"template": request.template, "reason": request.reason.saved(), "system": system, "user": request.user_text,
            "sampling": request.sampling, "messages": request.messages,
            "prompt_tokens": request.prompt_tokens}  # fmt: skip


async def preview(service: ChatService, check: DraftCheck, message: str) -> dict[str, Any]:
    """For a sample message: routing and why, and the request a new chat would send the engine for it (system and
    user text, sampling), both from the chat's own decision (ChatService.build_request) on the model serving now."""
    found = routing(service, check.store, check.template, message)
    result: dict[str, Any] = {"routing": found, "demo": found["demo"]}
    try:
        text = clean_input(message, service.cfg.chat.max_input_chars)  # the chat's own limit on a message
        request = await chat_view(service, check.store).build_request([], text, chat_settings(service))
    except ServiceError as exc:
        result["request_error"] = {"message": exc.message, "hint": exc.hint, "code": exc.code}
        return result
    result["request"] = request_json(request)
    return result


def valid_stem(stem: str) -> bool:
    """Whether `stem` may name a template file (the same rule as a template's name)."""
    return FILE_STEM.match(stem) is not None
