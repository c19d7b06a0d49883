"""Which template answers a message, with which system text and sampling, and why.

This is the one decision behind every request: the chat's (ChatService.build_request) and the workshop's preview
and try (backend.workshop), so what the workshop shows is what the chat sends, on the model that is serving. While the
offline demo model answers, templates route as with ERNIE, except those whose `route_on_demo` is false; what a
template leaves unset comes from the demo's measured defaults (results/demo-quality/report.md) instead of the chat's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from backend.chat.request import UserSettings
from backend.config import AppConfig
from backend.prompts.routing import command as slash_command
from backend.prompts.schema import SAMPLING_KEYS, Reason  # the sampling a template may set
from backend.prompts.store import Templates, UnknownTemplate

CHAT_KEYS = ("temperature", "top_p", "max_tokens")  # the chat's defaults (config: chat)
DEMO_KEYS = ("temperature", "top_p", "max_tokens", "frequency_penalty", "presence_penalty")  # config: demo
COMMAND_REASON = Reason(Reason.COMMAND)  # the template was asked for by name: /name, or the / menu


@dataclass(frozen=True)
class Decision:
    """What one message is sent as: the template and why, the system and user text, the sampling settings."""

    template: str
    reason: Reason  # a keyword, a pattern, the user's choice, a command; backend.chat.render words it
    system: str | None
    user: str
    sampling: dict[str, Any]
    demo: bool  # decided for the offline demo model
    question: str = ""  # the message as routed (a /name command taken off): what the user's documents are searched for
    passages: int = 0  # passages of the user's documents sent with it at most (0: none; the template's documents)


def decide(
    templates: Templates,
    cfg: AppConfig,
    text: str,
    settings: UserSettings,
    demo: bool,
    command: str | None = None,
    commands: bool = True,
) -> Decision:
    """Decide how `text` is sent: a command (the / menu, or /name typed: not with `commands` off, as for the API, where
    a message that begins with "/" is just text), the session's chosen template, or routing.

    Sampling: the defaults of the model that serves (chat, or demo with its penalties), then the template's own
    values, then what the user moved in the settings. The system text is the template's, else the serving model's
    default. An unknown template name raises UnknownTemplate naming the others."""
    name, rest = (command, text) if command or not commands else templates.split_command(text)
    if name is None and commands and (typed := slash_command(text)) is not None:
        raise UnknownTemplate(typed[0], templates.names())
    if name:
        prompt = dataclasses.replace(templates.route(rest, explicit=name), reason=COMMAND_REASON)
    else:
        prompt = templates.route(text, explicit=settings.template, demo=demo)
    defaults = cfg.demo if demo else cfg.chat
    sampling: dict[str, Any] = {key: getattr(defaults, key) for key in (DEMO_KEYS if demo else CHAT_KEYS)}
    sampling.update({k: v for k, v in prompt.sampling.items() if k in SAMPLING_KEYS and v is not None})
    sampling.update({key: getattr(settings, key) for key in settings.changed})
    system = prompt.system or (cfg.demo.system_prompt if demo else None) or cfg.chat.system_prompt
    passages = cfg.documents.passages if prompt.passages is None else prompt.passages
    passages = passages if prompt.documents and cfg.documents.enabled else 0
    return Decision(
        prompt.template, prompt.reason, system, prompt.user, sampling, demo, rest if name else text, passages
    )
