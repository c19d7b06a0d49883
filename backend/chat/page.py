"""What a chat turn and its settings look like on Chainlit's page: the messages, elements and widgets app.py sends
(the words come from render.py, the decisions from the service)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import chainlit as cl
from chainlit.input_widget import Select, Slider
from chainlit.utils import utc_now

from backend.chat.i18n import t
from backend.chat.render import details_element, notice_text, reply_text, template_select, wait_text
from backend.chat.request import SETTING_RANGES, UserSettings
from backend.chat.turn import Done, EngineWait, Event, Text

SYSTEM_AUTHOR = "system"  # the app's own notices (backend.storage.resume leaves them out of the model's history)
DETAILS_ELEMENT = "ReplyDetails"  # public/elements/ReplyDetails.jsx


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

    `describe` gives a template's description; `keep` the metadata that keeps a finished turn with its reply."""

    def __init__(self, lang: str, describe: Callable[[str], str], keep: Callable[[str, str], dict[str, Any]]) -> None:
        self.lang, self.describe, self.keep = lang, describe, keep
        self.note: cl.Message | None = None
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
            self.reply.metadata |= self.keep(event.user_text, event.text)
        await (self.reply.update() if event.text else self.reply.send())
        # last: the details under the reply tell the page (and the tests) that the reply is finished
        details = cl.CustomElement(name=DETAILS_ELEMENT, props=props, display="inline")
        await details.send(self.reply.id, persist=False)
