"""Which template a message goes to: a /name command, or the first template whose keywords or patterns match.

Rules look only at the instruction part of a message (its first line, then its last line, each up to the first
colon), so text pasted after "翻译成英文：" never triggers a template by itself.
"""

from __future__ import annotations

import re

from backend.prompts.schema import Reason, RenderedPrompt, Template

REQUEST_CHARS = 80  # rules look only at the instruction part of a message, at most this long
_COMMAND = re.compile(r"\s*/([A-Za-z0-9_-]+)(?:[\s:：]+(.*)|$)", re.DOTALL)
_COLON = re.compile(r"[:：]")


def request_parts(message: str) -> list[str]:
    """The parts of a message where people write the instruction: the first line, then the last line.

    Each is cut at the first colon and at REQUEST_CHARS, so text pasted after "翻译成英文：" or
    between the lines never triggers a template by itself.
    """
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return []
    picked = lines[:1] + lines[-1:] if len(lines) > 1 else lines
    return [_COLON.split(line, maxsplit=1)[0][:REQUEST_CHARS] for line in picked]


def pick(ordered: list[Template], message: str) -> RenderedPrompt:
    """Render `message` with the first template of `ordered` whose rules match it; the last one is the default."""
    for part in request_parts(message):  # the first line wins over the last line
        for template in ordered[:-1]:
            reason = template.match(part)
            if reason:
                return template.render(message, reason)
    return ordered[-1].render(message, Reason(Reason.DEFAULT))


def command(message: str) -> tuple[str, str] | None:
    """("name", rest) of a message written "/name rest" (name in lower case), else None."""
    found = _COMMAND.match(message)
    return None if found is None else (found.group(1).lower(), (found.group(2) or "").strip())
