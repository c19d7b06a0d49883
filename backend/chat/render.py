"""A chat turn's events as the text the user reads, in their language (the UI only places it on the page)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from backend.chat.context import Message
from backend.chat.i18n import MESSAGES, describe, describe_parts, t
from backend.chat.sources import Source, asked
from backend.chat.turn import Done, EngineWait, Notice, Queued, Refused, Serving
from backend.errors import Phrase
from backend.prompts.schema import Reason

SOURCES_KEY = "ernie_sources"  # a reply message's metadata: the passages of the user's documents it was given
DETAILS_KEY = "ernie_details"  # a reply message's metadata: its details (template, why, timings, token counts)
STARTERS = ("write", "summary", "translation", "explain")  # backend.chat.i18n: starter_<name>, starter_<name>_message
_CJK = re.compile(r"[\u3400-\u9fff]")


def notice_text(event: Notice | Refused, locale: str) -> str:
    """A message of its own: a notice with its list, or why the message was refused."""
    if isinstance(event, Refused):
        return t("error", locale, error=describe(event.error, locale))
    params = {k: v.text(locale) if isinstance(v, Phrase) else v for k, v in event.params.items()}
    return t(event.key, locale, **params) + "".join(f"\n- {item}" for item in event.items)


def wait_text(event: EngineWait | Queued, locale: str) -> str:
    """The engine's state while a message waits for it, or its place in line (one notice, updated)."""
    if isinstance(event, Queued):
        if event.place == 0:
            return t("queue_done", locale, waited=event.wait_s or 0.0)
        if event.wait_s is None:
            return t("queued_measuring", locale, place=event.place)
        return t("queued_late" if event.late else "queued", locale, place=event.place, wait=max(1.0, event.wait_s))
    if event.state == "failed":
        error, hint = describe_parts(event.problem, locale)
        text = t("failed", locale, error=error, hint=hint)
        if event.log_tail:
            text += "\n\n" + t("log_tail", locale, path=event.log_path) + f"\n```text\n{event.log_tail}\n```"
        return text
    if event.state == "restarting":
        return t("restarting", locale, elapsed=event.elapsed_s, error=describe(event.problem, locale))
    if event.state == "ready" and event.warmup_s is not None:
        return t("ready_warmed", locale, elapsed=event.elapsed_s, warmup=event.warmup_s)
    text = t(event.state, locale, elapsed=event.elapsed_s)
    return f"{text}\n\n🔎 {event.progress.text(locale)}" if event.progress else text


def reply_text(event: Done, locale: str) -> str:
    """The finished reply as shown: the text, and how it ended when it did not finish (details go apart)."""
    if event.ending == "finished":
        return event.text
    if event.ending == "stopped":
        ending = t("stopped", locale)
    else:
        ending = t("interrupted" if event.text else "error", locale, error=describe(event.error, locale))
    return f"{event.text}\n\n{ending}" if event.text else ending


def reason_text(reason: Reason | dict[str, str] | str, locale: str) -> str:
    """Why a template answered, in the user's language: a Reason, or one as saved (its data, or an older thread's
    English text); a reason the catalogue has no words for is shown as it is."""
    found = Reason.read(reason)
    key = f"reason_{found.code}"
    return t(key, locale, value=found.value) if key in MESSAGES else found.value


def localized(description: str, locale: str) -> str:
    """A template's description in the user's language: "总结：… / Summary: …" gives the half in that language."""
    halves = [half.strip() for half in description.split(" / ")]
    if len(halves) != 2:
        return description
    chinese = [half for half in halves if _CJK.search(half)]
    other = [half for half in halves if not _CJK.search(half)]
    if len(chinese) != 1 or len(other) != 1:
        return description
    return chinese[0] if locale.lower().startswith("zh") else other[0]


def reply_details(event: Done) -> dict[str, Any]:
    """The reply's details as numbers (kept in its metadata): template, reason, time to first token, speed, tokens."""
    stats = event.stats
    ttft = stats.ttft_s if stats else None
    prompt, output = event.usage
    speed = None
    if stats and output and stats.first_token is not None and stats.finished is not None:
        decoding = stats.finished - stats.first_token
        speed = round(output / decoding, 1) if decoding > 0 else None
    return {
        "template": event.template,
        "reason": event.reason.saved(),
        "ttft_s": None if ttft is None else round(ttft, 3),
        "tokens_per_s": speed,
        "prompt_tokens": prompt,
        "completion_tokens": output,
    }


def details_line(details: dict[str, Any], locale: str) -> list[str]:
    """The reply's details as the short items of one line, in the user's language (what is unknown is left out)."""
    items = [details["template"], reason_text(details["reason"], locale)]
    if details["ttft_s"] is not None:
        items.append(t("detail_ttft", locale, seconds=details["ttft_s"]))
    if details["tokens_per_s"] is not None:
        items.append(t("detail_speed", locale, speed=details["tokens_per_s"]))
    prompt, output = details["prompt_tokens"], details["completion_tokens"]
    if prompt is not None and output is not None:
        items.append(t("detail_tokens", locale, prompt=prompt, output=output))
    elif prompt is not None:
        items.append(t("detail_prompt_tokens", locale, prompt=prompt))
    return items


def details_props(details: dict[str, Any], locale: str, description: str) -> dict[str, Any]:
    """The props of the ReplyDetails element for a reply's details (reply_details, or kept in its metadata)."""
    return {
        "items": details_line(details, locale),
        "title": localized(description, locale),
        "label": t("details_title", locale),
    }


def details_element(event: Done, locale: str, description: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(props of the ReplyDetails element, metadata of the reply message) for a finished reply."""
    details = reply_details(event)
    return details_props(details, locale, description), {DETAILS_KEY: details}


def serving_status(serving: Serving, locale: str) -> dict[str, str]:
    """The first page's status, in the user's language: what answers ("SmolLM2-135M-Instruct (offline demo, not
    ERNIE) · llama.cpp · CPU") and the engine's state ("starting… 12 s", "ready")."""
    model = t("serving_demo", locale, model=serving.model) if serving.demo else serving.model
    parts = [model, serving.engine or t("engine_choosing", locale), serving.device]
    state = t(f"state_{serving.state}", locale, elapsed=serving.elapsed_s)
    if serving.progress is not None:
        state += " · " + serving.progress.text(locale)
    return {"serving": " · ".join(p for p in parts if p), "state": state, "code": serving.state,
            "tagline": t("tagline", locale)}  # fmt: skip


def starters(locale: str) -> list[tuple[str, str]]:
    """(label, message) of the first page's starters, one for each kind of template, in the user's language."""
    return [(t(f"starter_{name}", locale), t(f"starter_{name}_message", locale)) for name in STARTERS]


def template_select(
    described: list[tuple[str, str]], chosen: str | None, demo: bool, locale: str
) -> tuple[dict[str, str], str, str]:
    """(label -> value items, the value shown, the help line under it) of the settings panel's template selector:
    each template with its description, and a help line that explains the current choice."""
    descriptions = dict(described)
    current = chosen if chosen in descriptions else "auto"
    items = {t("template_auto", locale): "auto"}
    items |= {(f"{name} · {localized(text, locale)}" if text else name): name for name, text in described}
    if current == "auto":
        help_line = t("template_help_auto_demo" if demo else "template_help_auto", locale)
    else:
        help_line = t(
            "template_help_chosen", locale, name=current, description=localized(descriptions[current], locale)
        )
    return items, current, help_line


def template_commands(described: list[tuple[str, str]], locale: str) -> list[dict[str, Any]]:
    """The chat's / menu (Chainlit commands): one command a template, with its description in the user's language."""
    return [
        {"id": name, "description": localized(text, locale) or name, "icon": "sparkles", "button": False,
         "persistent": False}
        for name, text in described
    ]  # fmt: skip


def settings_saved(changed: dict[str, Any], locale: str) -> str:
    """The short acknowledgement of a settings change: what changed, to what."""
    if not changed:
        return t("settings_unchanged", locale)
    shown = {key: (t("template_auto", locale) if key == "template" and value is None else value)
             for key, value in changed.items()}  # fmt: skip
    items = t("list_separator", locale).join(f"{t(f'setting_{key}', locale)} → {value}" for key, value in shown.items())
    return t("settings_saved", locale, changes=items)


def exported(history: list[Message]) -> list[Message]:
    """The history as an export shows it: as kept, but the passages of the user's documents sent with a question
    left out of it (backend.chat.sources.asked)."""
    return [{**m, "content": asked(m["content"])} if m["role"] == "user" else m for m in history]


def export_markdown(history: list[Message], locale: str) -> str:
    """The conversation as Markdown: each message of the history under its role (exported)."""
    parts = [f"# {t('export_title', locale)}"]
    parts += [f"## {t('role_' + m['role'], locale)}\n\n{m['content']}" for m in exported(history)]
    return "\n\n".join(parts) + "\n"


def export_json(history: list[Message]) -> str:
    """The conversation as JSON: {"messages": [{"role", "content"}, ...]}, the history as exported."""
    return json.dumps({"messages": exported(history)}, ensure_ascii=False, indent=2) + "\n"


EXPORT_TYPES = {"md": "text/markdown", "json": "application/json"}  # an export's format -> its file's type


def export(history: list[Message], fmt: str, locale: str) -> str:
    """The conversation in the export format `fmt` (one of EXPORT_TYPES)."""
    return export_markdown(history, locale) if fmt == "md" else export_json(history)


def source_label(source: Source, locale: str) -> str:
    """Where a passage is from, in the user's language: "[1] handbook.pdf · p. 3", "[2] notes.md · Safety"."""
    where = t("source_page", locale, page=source.page) if source.page is not None else (source.heading or "")
    return f"[{source.number}] {source.document}" + (f" · {where}" if where else "")


def saved_sources(metadata: Mapping[str, Any]) -> list[Source]:
    """The passages a reply was given, as kept in its metadata (SOURCES_KEY); [] where it has none."""
    kept = metadata.get(SOURCES_KEY)
    if not isinstance(kept, list):
        return []
    return [Source.read(s) for s in kept if isinstance(s, dict) and isinstance(s.get("text"), str)]


def sources_props(sources: list[Source], locale: str) -> dict[str, Any]:
    """The props of the ReplySources element: a title, and each passage's label and text (opened on a click)."""
    items = [{"label": source_label(s, locale), "text": s.text} for s in sources]
    return {"title": t("sources_title", locale), "items": items}
