"""What a chat turn and its settings look like on Chainlit's page: the messages, elements and widgets app.py sends
(the words come from render.py, the decisions from the service)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import chainlit as cl
from chainlit.chat_context import chat_context
from chainlit.input_widget import Select, Slider
from chainlit.utils import utc_now

from backend.chat.context import Message
from backend.chat.i18n import t
from backend.chat.render import (
    EXPORT_TYPES,
    details_element,
    export,
    notice_text,
    reply_text,
    template_select,
    wait_text,
)
from backend.chat.request import SETTING_RANGES, UserSettings
from backend.chat.turn import Done, EngineWait, Event, Text

SYSTEM_AUTHOR = "system"  # the app's own notices (backend.storage.resume leaves them out of the model's history)
DETAILS_ELEMENT = "ReplyDetails"  # public/elements/ReplyDetails.jsx
ASKED_KEY = "ernie_asked"  # a kept turn's reply metadata: the page's id of the user message that asked it
REGENERATE, EXPORT = "regenerate", "export"  # the last reply's actions (app.py's action callbacks)
# The metadata that keeps a finished turn (backend.storage.resume.turn_metadata): its texts, counts, their counter.
Keep = Callable[[str, str, tuple[int | None, int | None], str], dict[str, Any]]


async def say(text: str) -> cl.Message:
    """A notice from the app (not the model)."""
    return await cl.Message(content=text, author=SYSTEM_AUTHOR).send()


def settings_widgets(
    settings: UserSettings, described: list[tuple[str, str]], demo: bool, lang: str
) -> list[Slider | Select]:
    """The settings panel: the sampling sliders and the template selector (descriptions, a help line)."""
    widgets: list[Slider | Select] = [
        Slider(id=key, label=t(f"setting_{key}", lang), initial=getattr(settings, key), min=lo, max=hi, step=step)
        for key, (lo, hi, step) in SETTING_RANGES.items()
    ]
    items, chosen, help_line = template_select(described, settings.template, demo, lang)
    widgets.append(Select(id="template", label=t("setting_template", lang), items=items, initial_value=chosen,
                          description=help_line))  # fmt: skip
    return widgets


class TurnPage:
    """One turn on the page: the engine notice (sent once, then updated), the streamed reply, its details.

    `describe` gives a template's description; `keep` the metadata that keeps a finished turn with its reply;
    `asked` is the page's id of the user message."""

    def __init__(self, lang: str, describe: Callable[[str], str], keep: Keep, asked: str) -> None:
        self.lang, self.describe, self.keep, self.asked = lang, describe, keep, asked
        self.note: cl.Message | None = None
        self.finished = False  # the reply was shown with its details (not refused, not waiting in vain)
        # A streamed message gets no time of its own (it is never send()): saved without one, it would sort first.
        self.reply = cl.Message(content="", created_at=utc_now())

    async def show(self, event: Event) -> None:
        if isinstance(event, EngineWait):
            if self.note is None and event.state != "ready":  # "ready" only updates a notice already shown
                self.note = await say(wait_text(event, self.lang))
            elif self.note is not None:
                self.note.content = wait_text(event, self.lang)
                await self.note.update()
        elif isinstance(event, Text):
            await self.reply.stream_token(event.text)
        elif isinstance(event, Done):
            await self.finish(event)
        else:
            await say(notice_text(event, self.lang))

    async def finish(self, event: Done) -> None:
        self.reply.content = reply_text(event, self.lang)
        props, self.reply.metadata = details_element(event, self.lang, self.describe(event.template))
        if event.text:  # the turn as the model saw it: a resumed thread rebuilds the history from these
            kept = self.keep(event.user_text, event.text, event.tokens, event.counted_by)
            self.reply.metadata |= kept | {ASKED_KEY: self.asked}
        await (self.reply.update() if event.text else self.reply.send())
        # last: the details under the reply tell the page (and the tests) that the reply is finished
        details = cl.CustomElement(name=DETAILS_ELEMENT, props=props, display="inline")
        await details.send(self.reply.id, persist=False)
        self.finished = True


async def offer_actions(reply: cl.Message, lang: str) -> None:
    """The last reply's buttons: regenerate it, export the conversation as Markdown or JSON (earlier replies lose
    theirs: regenerate is for the last reply only)."""
    for action in cl.user_session.get("actions") or []:
        await action.remove()
    actions = [
        cl.Action(name=REGENERATE, payload={}, label=t("action_regenerate", lang), icon="refresh-cw"),
        cl.Action(name=EXPORT, payload={"format": "md"}, label=t("action_export_md", lang), icon="file-text"),
        cl.Action(name=EXPORT, payload={"format": "json"}, label=t("action_export_json", lang), icon="file-json"),
    ]
    for action in actions:
        await action.send(for_id=reply.id)
    cl.user_session.set("actions", actions)


async def take_back_last_reply() -> cl.Message | None:
    """For a regenerate: remove what came after the last user message (its reply, the notices) and return it."""
    messages = chat_context.get()
    asked = [i for i, message in enumerate(messages) if message.type == "user_message"]
    if not asked:
        return None
    for message in messages[asked[-1] + 1 :]:
        await message.remove()
    return messages[asked[-1]]


async def send_export(history: list[Message], fmt: str, lang: str) -> None:
    """The conversation (the history as the model has it) as a file to download, in a notice."""
    if fmt not in EXPORT_TYPES:
        return
    if not history:
        await say(t("nothing_to_export", lang))
        return
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    notice = await say(t("exported", lang, messages=len(history)))
    file = cl.File(name=f"conversation-{stamp}.{fmt}", content=export(history, fmt, lang).encode(),
                   mime=EXPORT_TYPES[fmt], display="inline")  # fmt: skip
    await file.send(notice.id, persist=False)


async def run_as_task(work: Awaitable[None]) -> None:
    """Run `work` as Chainlit runs a message: the page shows it busy, and its stop button cancels it."""
    session = cl.context.session

    async def task() -> None:
        await cl.context.emitter.task_start()
        try:
            await work
        except asyncio.CancelledError:
            pass
        finally:
            await cl.context.emitter.task_end()

    session.current_task = asyncio.create_task(task())


def asked_ids(steps: list[dict[str, Any]]) -> list[str]:
    """The ids of the user messages that asked a saved thread's kept turns, oldest first (an edit of one of them
    after a resume drops its turn, as in the chat that asked it)."""
    found = []
    for step in steps:
        metadata = step.get("metadata") or {}
        if isinstance(metadata, str):  # SQLite keeps JSON columns as text
            try:
                metadata = json.loads(metadata)
            except json.JSONDecodeError:
                continue
        if isinstance(metadata, dict) and isinstance(metadata.get(ASKED_KEY), str):
            found.append(metadata[ASKED_KEY])
    return found
