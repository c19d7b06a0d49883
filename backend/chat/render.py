"""A chat turn's events as the text the user reads, in their language (the UI only places it on the page)."""

from __future__ import annotations

from backend.chat.i18n import describe, describe_parts, t
from backend.chat.turn import Done, EngineWait, Notice, Refused


def notice_text(event: Notice | Refused, locale: str) -> str:
    """A message of its own: a notice with its list, or why the message was refused."""
    if isinstance(event, Refused):
        return t("error", locale, error=describe(event.error, locale))
    return t(event.key, locale, **event.params) + "".join(f"\n- {item}" for item in event.items)


def wait_text(event: EngineWait, locale: str) -> str:
    """The engine's state while a message waits for it (one notice, updated)."""
    if event.state == "failed":
        error, hint = describe_parts(event.problem, locale)
        text = t("failed", locale, error=error, hint=hint)
        if event.log_tail:
            text += "\n\n" + t("log_tail", locale, path=event.log_path) + f"\n```text\n{event.log_tail}\n```"
        return text
    if event.state == "restarting":
        return t("restarting", locale, elapsed=event.elapsed_s, error=describe(event.problem, locale))
    return t(event.state, locale, elapsed=event.elapsed_s)


def reply_text(event: Done, locale: str) -> str:
    """The finished reply as shown: the text, how it ended when it did not finish, and the template footer."""
    if event.ending == "finished":
        ending = ""
    elif event.ending == "stopped":
        ending = t("stopped", locale)
    else:
        ending = t("interrupted" if event.text else "error", locale, error=describe(event.error, locale))
    footer = f"\n\n*{t('template_used', locale, name=event.template)} · {event.reason}*"
    return event.text + (f"\n\n{ending}" if ending else "") + footer
