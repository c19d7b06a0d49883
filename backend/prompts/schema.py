"""The template file: its fields, what each must hold, and reading one file into a checked Template.

Every problem is worded for the person who edits the file (file, line, field, what to do): see TemplateProblem.
"""

from __future__ import annotations

import difflib
import json
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from backend.config import yaml_error_line, yaml_problem

DEFAULT_NAME = "default"
AUTO = "auto"  # a selector value meaning "route by the rules"; no template may use this name
MAX_FILE_BYTES = 64 * 1024
SAMPLING_KEYS = ("temperature", "top_p", "max_tokens", "stop")
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,39}$"

_KEY = re.compile(r"\s*([A-Za-z_]\w*)\s*:")  # the field named at the start of a YAML line
_BRACES = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")  # the same left-to-right reading as str.format

# What each field must hold, in words an editor understands; used for every schema error.
_RULES = {
    "name": 'a short name such as "writing": lowercase letters, digits, "-" or "_"',
    "description": "text",
    "priority": "a whole number such as 10 or -5",
    "keywords": "a list of words, for example [写, write]",
    "patterns": "a list of regular expressions",
    "system": "text",
    "user": "text containing {input}",
    "variables": "a list of `name: default value` lines",
    "temperature": "a number between 0 and 2",
    "top_p": "a number greater than 0 and at most 1",
    "max_tokens": "a whole number from 1 to 32768",
    "stop": "a list of texts",
    "route_on_demo": "true or false",
    "documents": "true or false",
    "passages": "a whole number from 0 to 20",
}
_ITEM_RULES = {"keywords": "text", "patterns": "text", "stop": "text"}
_YAML_HINTS = {
    "found character '\\t'": "use spaces, not tabs, to indent",
    "mapping values are not allowed": 'a value that contains ": " needs quotes, or use "|" for long text',
    "expected a single document": 'keep one template per file (remove the extra "---" line)',
    "could not find expected ':'": 'every line needs the form "field: value"',
}


class TemplateFile(BaseModel):
    """The schema of one template file; unknown keys are an error so typos don't pass silently."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str | None = Field(None, pattern=NAME_PATTERN)
    description: str = ""
    priority: int = 0
    keywords: list[str] = []
    patterns: list[str] = []
    system: str | None = Field(None, json_schema_extra={"form": "block"})
    user: str = Field(json_schema_extra={"form": "block"})
    variables: dict[str, str | int | float] = {}
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1, le=32768)
    stop: list[str] | None = None
    route_on_demo: bool = True
    documents: bool = True  # the passages of the user's documents that answer the message are sent with it
    passages: int | None = Field(None, ge=0, le=20)  # how many (None: documents.passages of the configuration)


def form_fields() -> list[dict[str, Any]]:
    """The template fields in file order, as the workshop's form shows them: each one's name, kind of input (line,
    block, list, mapping, number, choice) and, for numbers, their range (ge, gt, le)."""
    kinds: dict[Any, str] = {list: "list", dict: "mapping", int: "number", float: "number", bool: "choice", str: "line"}
    out = []
    for name, info in TemplateFile.model_fields.items():
        kept = info.annotation
        if isinstance(kept, types.UnionType):  # X | None: the form leaves it empty for None
            kept = next(t for t in typing.get_args(kept) if t is not type(None))
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        kind = extra.get("form") or kinds[typing.get_origin(kept) or kept]
        limits = {key: getattr(m, key) for m in info.metadata for key in ("ge", "gt", "le") if hasattr(m, key)}
        out.append({"name": name, "kind": kind, "range": limits})
    return out


# The English texts replies were saved with before reasons were data (threads saved then are still read).
_OLD_RULE = re.compile(r'(keyword|pattern|demo_off) "(.*)"', re.DOTALL)
_OLD_WORDS = {"no rule matched": "default", "chosen": "chosen", "command": "command",
              "demo model: automatic templates are off": "demo"}  # fmt: skip


@dataclass(frozen=True)
class Reason:
    """Why a template answers a message, as data: what decided (`code`) and the rule or template it names (`value`).

    backend.chat.render words it in the reader's language (the catalogue's reason_<code>)."""

    code: str  # one of the names below
    value: str = ""

    KEYWORD: ClassVar[str] = "keyword"  # value: the keyword that matched
    PATTERN: ClassVar[str] = "pattern"  # value: the pattern that matched
    DEFAULT: ClassVar[str] = "default"  # no rule matched
    CHOSEN: ClassVar[str] = "chosen"  # chosen in the settings
    COMMAND: ClassVar[str] = "command"  # asked for by name: /name, or the / menu
    DEMO_OFF: ClassVar[str] = "demo_off"  # value: the template that matched but does not route on the demo model
    TEXT: ClassVar[str] = "text"  # value: a saved reason no code reads (shown as it is)

    def saved(self) -> dict[str, str]:
        """The reason as saved in a reply's metadata."""
        return {"code": self.code, "value": self.value}

    @classmethod
    def read(cls, saved: object) -> Reason:
        """A saved reason: its data, or the English text replies were saved with before (older threads)."""
        if isinstance(saved, Reason):
            return saved
        if isinstance(saved, dict) and isinstance(saved.get("code"), str):
            return cls(saved["code"], str(saved.get("value", "")))
        text = str(saved or "")
        if rule := _OLD_RULE.fullmatch(text):
            return cls(rule.group(1), rule.group(2))
        return cls(_OLD_WORDS[text]) if text in _OLD_WORDS else cls(cls.TEXT, text)


@dataclass(frozen=True)
class RenderedPrompt:
    """What to send to the model for one message, and which template produced it."""

    template: str
    system: str | None
    user: str
    sampling: dict[str, Any]
    reason: Reason  # why this template (a keyword, a pattern, ...), for the reply footer
    documents: bool = True  # whether passages of the user's documents are sent with the message
    passages: int | None = None  # how many at most (None: the configuration's documents.passages)


@dataclass(frozen=True)
class TemplateProblem:
    """One thing wrong with a template file, worded for the person who edits it."""

    path: str
    line: int | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = self.path + (f", line {self.line}" if self.line is not None else "")
        where += f', field "{self.field}"' if self.field else ""
        return f"{where}: {self.message}"


@dataclass(frozen=True)
class Template:
    """A loaded, validated template ready to render."""

    name: str
    description: str
    path: str
    user: str
    system: str | None = None
    priority: int = 0
    keywords: tuple[str, ...] = ()
    patterns: tuple[re.Pattern[str], ...] = ()
    variables: dict[str, str] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    name_line: int | None = None
    route_on_demo: bool = True  # whether routing picks it while the offline demo model answers (/name always can)
    documents: bool = True  # whether passages of the user's documents are sent with its messages
    passages: int | None = None  # how many at most (None: the configuration's documents.passages)

    def match(self, request: str) -> Reason | None:
        """Return why this template fits the request text (a keyword or pattern), or None."""
        folded = request.casefold()
        for word in self.keywords:
            if _keyword_in(word.casefold(), folded):
                return Reason(Reason.KEYWORD, word)
        for pattern in self.patterns:
            if pattern.search(request):
                return Reason(Reason.PATTERN, pattern.pattern)
        return None

    def render(self, message: str, reason: Reason) -> RenderedPrompt:
        """Fill the placeholders; only the template text is a format string, never the message."""
        values = {**self.variables, "input": message}
        system = self.system.format_map(values) if self.system is not None else None
        user = self.user.format_map(values)
        return RenderedPrompt(self.name, system, user, dict(self.sampling), reason, self.documents, self.passages)


def _keyword_in(word: str, text: str) -> bool:
    # English keywords match whole words ("write" must not fire on "rewrite" or "writer"); Chinese has no
    # spaces between words, so a Chinese keyword matches anywhere.
    before = r"(?<![a-z0-9])" if word[:1].isascii() and word[:1].isalnum() else ""
    after = r"(?![a-z0-9])" if word[-1:].isascii() and word[-1:].isalnum() else ""
    return re.search(before + re.escape(word) + after, text) is not None


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _shown(value: Any) -> str:
    if value is None:
        return "nothing"
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


class FileProblems(Exception):
    def __init__(self, problems: list[TemplateProblem]) -> None:
        super().__init__(problems)
        self.problems = problems


class _Lines:
    """Finds the line of a field in a YAML document, from yaml.compose node marks."""

    def __init__(self, text: str) -> None:
        try:
            self.root: yaml.Node | None = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError:
            self.root = None

    def node(self, loc: tuple[Any, ...]) -> tuple[yaml.Node | None, yaml.Node | None]:
        """Return (key node, value node) at loc, or as deep as loc could be followed."""
        key: yaml.Node | None = None
        node = self.root
        for part in loc:
            if isinstance(node, yaml.MappingNode):
                hit = next(((k, v) for k, v in node.value if str(k.value) == str(part)), None)
                if hit is None:
                    break
                key, node = hit
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                key = node = node.value[part]
            else:
                break
        return key, node

    def of(self, loc: tuple[Any, ...]) -> int | None:
        """1-based line of the key (or list item) at loc."""
        key, node = self.node(loc)
        target = key if key is not None else node
        return target.start_mark.line + 1 if target is not None else None

    def in_text(self, name: str, offset: int, text: str) -> int | None:
        """Line of a character inside a text field; exact for "|" blocks, else the field's line."""
        _, node = self.node((name,))
        if isinstance(node, yaml.ScalarNode) and node.style == "|":
            return node.start_mark.line + 2 + text.count("\n", 0, offset)
        return self.of((name,))


def _placeholders(text: str) -> list[tuple[int, str | None, str]]:
    """Scan str.format syntax: (offset, name, "") for a placeholder, (offset, None, error) for a mistake."""
    found: list[tuple[int, str | None, str]] = []
    for hit in _BRACES.finditer(text):
        inner = hit.group(1)
        if inner is not None and inner.isidentifier():
            found.append((hit.start(), inner, ""))
        elif inner is not None:
            found.append((hit.start(), None, f'has "{hit.group()}"; a placeholder is a name like {{input}}'))
        elif hit.group() not in ("{{", "}}"):
            found.append((hit.start(), None, 'has a single "{" or "}"; write {{ or }} to show a brace'))
    return found


def parse_template(path: Path, data: bytes) -> Template:
    """Validate one file's bytes into a Template, or raise FileProblems listing everything wrong."""
    shown = display_path(path)

    def problem(line: int | None, name: str | None, message: str) -> FileProblems:
        return FileProblems([TemplateProblem(shown, line, name, message)])

    if b"\0" in data:
        raise problem(None, None, "this is not a text file; template files are plain UTF-8 text")
    try:
        text = data.decode("utf-8-sig")  # tolerate the BOM some Windows editors add
    except UnicodeDecodeError as exc:
        bad_line = data[: exc.start].count(b"\n") + 1
        raise problem(bad_line, None, "the file is not UTF-8 text; save it as UTF-8 in your editor") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        at = yaml_error_line(exc)
        detail = yaml_problem(exc)
        hints = [hint for key, hint in _YAML_HINTS.items() if key in str(exc)]
        hint = hints[0] if hints else "check indentation, colons and quotes"
        # an unclosed bracket is reported at the end of the stream; point at the last line instead
        line = min(at, len(text.rstrip().splitlines()) or 1) if at is not None else None
        named = _KEY.match(text.splitlines()[line - 1]) if line and text.strip() else None
        raise problem(line, named and named.group(1), f"this is not valid YAML ({detail}); {hint}") from None
    if raw is None:
        raise problem(None, None, "the file is empty; a template needs at least a `user:` text with {input}")
    if not isinstance(raw, dict):
        raise problem(1, None, "the file must hold `field: value` lines (name:, user:, ...), one per field")
    for key in ("keywords", "patterns", "stop"):  # one word written without [ ] is obviously meant as a list
        if isinstance(raw.get(key), str):
            raw[key] = [raw[key]]
    lines = _Lines(text)
    try:
        model = TemplateFile.model_validate(raw)
    except ValidationError as exc:
        raise FileProblems(_schema_problems(shown, raw, exc, lines)) from None
    return _build(path, shown, model, lines)


def _schema_problems(shown: str, raw: dict[str, Any], exc: ValidationError, lines: _Lines) -> list[TemplateProblem]:
    problems: dict[tuple[Any, ...], TemplateProblem] = {}
    for error in exc.errors():
        loc, value = _data_loc(raw, error["loc"]), error.get("input")
        if error["type"] == "missing":
            loc = error["loc"]
        if not loc or loc in problems:  # a union reports once per member; one message is enough
            continue
        top = str(loc[0])
        if error["type"] == "extra_forbidden":
            close = difflib.get_close_matches(top, list(_RULES), n=1)
            guess = f'did you mean "{close[0]}"? ' if close else ""
            message = f"is not a known field; {guess}known fields: {', '.join(_RULES)}"
        elif error["type"] == "missing":
            message = f"is required; it must be {_RULES.get(top, 'set')}"
        elif top == "variables" and len(loc) > 1:
            top = f"variables.{loc[1]}"
            message = f"must be text or a number; every variable needs a default value (got {_shown(value)})"
        elif isinstance(value, dict) and _RULES.get(top, "").startswith("text"):
            message = f'must be {_RULES[top]}; text that starts with "{{" needs quotes, like user: "{{input}}"'
        elif len(loc) > 1 and top in _ITEM_RULES:
            message = f"item {int(loc[1]) + 1} must be {_ITEM_RULES[top]} (got {_shown(value)})"
        else:
            message = f"must be {_RULES.get(top, 'valid')} (got {_shown(value)})"
        problems[loc] = TemplateProblem(shown, None if error["type"] == "missing" else lines.of(loc), top, message)
    return list(problems.values())


def _data_loc(raw: Any, loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """The part of a pydantic error location that exists in the data (drops union member tags)."""
    kept: list[Any] = []
    node = raw
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            break
        kept.append(part)
    return tuple(kept)


def _build(path: Path, shown: str, model: TemplateFile, lines: _Lines) -> Template:
    problems: list[TemplateProblem] = []

    def add(line: int | None, name: str, message: str) -> None:
        problems.append(TemplateProblem(shown, line, name, message))

    name = model.name if model.name is not None else path.stem
    if model.name is None and not re.match(NAME_PATTERN, name):
        add(
            None,
            "name",
            f'is missing and the file name "{name}" is not a valid name; add it: {_RULES["name"]}',
        )
    if name == AUTO:
        add(lines.of(("name",)), "name", f'"{AUTO}" is reserved for automatic routing; choose another name')
    variables: dict[str, str] = {}
    for key, value in model.variables.items():
        where = lines.of(("variables", key))
        if key == "input":
            add(where, "variables.input", "{input} is always the message; choose another variable name")
        elif not key.isidentifier():
            add(
                where,
                f"variables.{key}",
                "a variable name may use only letters, digits and _ (no spaces or -)",
            )
        variables[key] = str(value)
    for text_field in ("system", "user"):
        text = getattr(model, text_field)
        used = set()
        for offset, placeholder, error in _placeholders(text or ""):
            line = lines.in_text(text_field, offset, text)
            if placeholder is None:
                add(line, text_field, error)
            elif placeholder != "input" and placeholder not in variables:
                add(
                    line,
                    text_field,
                    f'uses {{{placeholder}}} but there is no variable "{placeholder}"; add it under '
                    f"variables with a default value, or write {{{{{placeholder}}}}} to show the braces",
                )
            used.add(placeholder)
        if text_field == "user" and "input" not in used:
            add(lines.of(("user",)), "user", "must contain {input}, the place where the message goes")
    compiled = []
    for index, source in enumerate(model.patterns):
        where = lines.of(("patterns", index))
        try:
            pattern = re.compile(source, re.IGNORECASE)
        except re.error as exc:
            add(
                where,
                "patterns",
                f"item {index + 1} is not a valid regular expression ({exc.msg} at position {exc.pos})",
            )
            continue
        if pattern.search(""):
            add(where, "patterns", f"item {index + 1} matches every message; make it more specific")
        compiled.append(pattern)
    for index, word in enumerate(model.keywords):
        if not word.strip():
            add(
                lines.of(("keywords", index)),
                "keywords",
                f"item {index + 1} is empty and would match every message",
            )
    if problems:
        raise FileProblems(problems)
    return Template(
        name=name,
        description=model.description.strip(),
        path=shown,
        user=model.user.rstrip(),  # a "|" block ends with a newline nobody means to send
        system=model.system.rstrip() if model.system is not None else None,
        priority=model.priority,
        keywords=tuple(word.strip() for word in model.keywords),
        patterns=tuple(compiled),
        variables=variables,
        sampling={key: getattr(model, key) for key in SAMPLING_KEYS if getattr(model, key) is not None},
        name_line=lines.of(("name",)) if model.name is not None else None,
        route_on_demo=model.route_on_demo,
        documents=model.documents,
        passages=model.passages,
    )
