"""What a chat turn and its settings look like on Chainlit's page: the messages, elements and widgets the hooks send
(the words come from render.py, the decisions from the service)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import chainlit as cl
from chainlit.chat_context import chat_context
from chainlit.data import get_data_layer
from chainlit.input_widget import InputWidget, Select, Slider
from chainlit.utils import utc_now

from backend.chat.context import Message
from backend.chat.i18n import t
from backend.chat.live import LiveReply
from backend.chat.render import (
    DETAILS_KEY,
    EXPORT_TYPES,
    SOURCES_KEY,
    details_element,
    details_props,
    export,
    notice_text,
    reply_text,
    saved_sources,
    sources_props,
    template_select,
    wait_text,
)
from backend.chat.request import SETTING_RANGES, UserSettings
from backend.chat.saved import ASKED_KEY, LIVE_KEY, NOTICE_KEY, SYSTEM_AUTHOR, turn_metadata
from backend.chat.turn import ChatSession, Done, EngineWait, Event, Notice, Queued, Started, Text

log = logging.getLogger(__name__)

DETAILS_ELEMENT = "ReplyDetails"  # public/elements/ReplyDetails.jsx
SOURCES_ELEMENT = "ReplySources"  # public/elements/ReplySources.jsx
REGENERATE, EXPORT = "regenerate", "export"  # the last reply's actions (app.py's action callbacks)
SAVE_EVERY_S = 1.0  # a reply being written is saved this often (an app killed meanwhile keeps what was written)


async def say(text: str, notice: str = "") -> cl.Message:
    """A notice from the app (not the model); `notice`: which one (kept with it: a resumed chat knows it was told)."""
    return await cl.Message(
        content=text, author=SYSTEM_AUTHOR, metadata={NOTICE_KEY: notice} if notice else None
    ).send()


def settings_widgets(
    settings: UserSettings, described: list[tuple[str, str]], demo: bool, lang: str
) -> list[InputWidget]:
    """The settings panel: the sampling sliders and the template selector (descriptions, a help line)."""
    widgets: list[InputWidget] = [
        Slider(id=key, label=t(f"setting_{key}", lang), initial=getattr(settings, key), min=lo, max=hi, step=step)
        for key, (lo, hi, step) in SETTING_RANGES.items()
    ]
    items, chosen, help_line = template_select(described, settings.template, demo, lang)
    widgets.append(Select(id="template", label=t("setting_template", lang), items=items, initial_value=chosen,
                          description=help_line))  # fmt: skip
    return widgets


async def show_only(text: str) -> cl.Message:
    """A notice on this page only (the page that asked the reply saves it)."""
    message = cl.Message(content=text, author=SYSTEM_AUTHOR, created_at=utc_now())
    chat_context.add(message)
    await cl.context.emitter.send_step(message.to_dict())
    return message


class ReplyView:
    """One page's view of a live reply: the engine notice (sent once, then updated), the streamed reply, its details.

    Every page that follows the reply has one; the page that asked it (`own`) also saves it: the notices as they
    come, the reply as it grows (marked live) and as it ends. A page that comes in the middle (a reload, a second
    tab) starts from the text so far, shows the stop button, and gives its own chat (`chat`) the finished turn.
    `describe` gives a template's description."""

    def __init__(self, live: LiveReply, lang: str, describe: Callable[[str], str], own: bool, chat: ChatSession):
        self.live, self.lang, self.describe, self.own, self.chat = live, lang, describe, own, chat
        self.note: cl.Message | None = None
        self.finished = False  # the reply was shown with its details (not refused, not waiting in vain)
        self.ended = False
        self.attached = True  # the page is there (a page whose websocket went away is not, until it comes back)
        self.under: dict[str, Any] | None = None  # the finished reply's metadata: what it shows under it (send_under)
        self.reply = cl.Message(content="", id=live.reply_id)
        self._user_text = ""
        self._streamed = False  # the page has the reply message (streamed), to be updated
        self._saved_at = 0.0
        self._lock = asyncio.Lock()  # one update of the page at a time: a catch-up never splits one

    async def run(self) -> None:
        """Show the reply to its end (the page may go away meanwhile: the reply goes on, and is saved)."""
        start = 0
        if not self.own:
            self.live.attach()
            self.live.share(self.chat)  # a page that came back: its chat gets the turn too
            starting = cl.context.session.current_task  # the page's start: it ends by hiding the stop button
            if starting is not None and starting is not asyncio.current_task() and not starting.done():
                await asyncio.wait([starting])
            snapshot = self.live.snapshot()
            start = snapshot.index
            self.reply.created_at = utc_now()
            chat_context.add(self.reply)
            await cl.context.emitter.task_start()
            if snapshot.text:
                await self._stream(snapshot.text)
        try:
            async for event in self.live.follow(start):
                await self.show(event)
            if self.live.stopped_early:  # stopped before the reply began
                await (say if self.own else show_only)(t("stopped", self.lang))
        finally:
            self.ended = True
            if self.attached:
                self.attached = False
                self.live.detach()
            if self.own:
                self.live.saved.set()
            else:
                await cl.context.emitter.task_end()

    async def show(self, event: Event) -> None:
        if isinstance(event, EngineWait | Queued):
            done = event.state == "ready" if isinstance(event, EngineWait) else event.place == 0
            if self.note is None and not done:  # "ready" (or "your turn") only updates a notice already shown
                self.note = await (say if self.own else show_only)(wait_text(event, self.lang))
            elif self.note is not None:
                self.note.content = wait_text(event, self.lang)
                await (self.note.update() if self.own else cl.context.emitter.update_step(self.note.to_dict()))
        elif isinstance(event, Started):
            self.reply.created_at = utc_now()  # after the notices: a saved thread shows them in this order
            self._user_text = event.user_text
        elif isinstance(event, Text):
            await self._stream(event.text)
            if self.own and time.monotonic() - self._saved_at >= SAVE_EVERY_S:
                await self._save_growing()
        elif isinstance(event, Done):
            await self.finish(event)
        elif self.own:
            await say(notice_text(event, self.lang), event.key if isinstance(event, Notice) else "")
        else:
            await show_only(notice_text(event, self.lang))

    async def _stream(self, text: str) -> None:
        async with self._lock:
            await self.reply.stream_token(text)
            self._streamed = True

    async def _save_growing(self) -> None:
        """Save the reply as it is now, marked live (an app killed meanwhile shows it cut off when it comes back)."""
        self._saved_at = time.monotonic()
        if not self.reply.content:
            return
        step = self.reply.to_dict()
        step["streaming"] = False  # as a reopened thread shows it: the app that wrote it may be gone
        step["metadata"] = turn_metadata(self._user_text, self.reply.content) | {
            ASKED_KEY: self.live.asked,
            LIVE_KEY: True,
        }
        await self._save(step)

    async def _save(self, step: Any) -> None:
        """Save the reply (awaited: a shutdown waits for it; a save never overtakes the one before)."""
        layer = get_data_layer()
        if layer is None:
            return
        try:
            await layer.update_step(step)
        except Exception as exc:  # the page goes on; the data layer reports its problems itself
            log.warning("Could not save a reply: %s", exc)

    async def finish(self, event: Done) -> None:
        ending = reply_text(event, self.lang)
        if self.live.cut_off and event.ending == "stopped":
            ending = f"{event.text}\n\n{t('restarted', self.lang)}" if event.text else t("restarted", self.lang)
        _, metadata = details_element(event, self.lang, self.describe(event.template))
        if event.text:  # the turn as the model saw it: a resumed thread rebuilds the history from these
            kept = turn_metadata(event.user_text, event.text, event.tokens, event.counted_by)
            metadata |= kept | {ASKED_KEY: self.live.asked}
        if event.sources:
            metadata[SOURCES_KEY] = [source.saved() for source in event.sources]
        async with self._lock:
            self.reply.content, self.reply.metadata, self.reply.streaming = ending, metadata, False
            self.reply.created_at = self.reply.created_at or utc_now()
            chat_context.add(self.reply)
            step = self.reply.to_dict()
            emitter = cl.context.emitter
            await (emitter.update_step(step) if self._streamed else emitter.send_step(step))
            if self.own:
                await self._save(step)
            self.under = metadata
            await send_under(self.reply.id, metadata, self.lang, self.describe)
        self.finished = True

    async def catch_up(self) -> None:
        """The page's websocket came back (what was sent meanwhile was lost): show the reply as it is now."""
        if not self.attached and not self.ended:
            self.attached = True
            self.live.attach()
        async with self._lock:
            if self._streamed or self.under is not None:
                step = self.reply.to_dict()
                step["streaming"] = not self.ended
                await cl.context.emitter.send_step(step)  # added, or updated if the page has it
            if self.under is not None:
                await send_under(self.reply.id, self.under, self.lang, self.describe)
        if not self.ended:
            await cl.context.emitter.task_start()

    def went_away(self) -> None:
        """The page's websocket went away: the reply goes on without it."""
        if self.attached and not self.ended:
            self.attached = False
            self.live.detach()


async def send_details(reply_id: str, props: dict[str, Any]) -> None:
    """The details under a reply (not saved: a resumed thread shows them again from the reply's metadata)."""
    details = cl.CustomElement(name=DETAILS_ELEMENT, props=props, display="inline")
    await details.send(reply_id, persist=False)


async def send_under(reply_id: str, metadata: Mapping[str, Any], lang: str, describe: Callable[[str], str]) -> None:
    """What a finished reply shows under it, from its metadata: the passages of the user's documents it was given
    (ReplySources), then its details (last: they tell the page, and the tests, that the reply is finished). Neither
    is saved as an element: a resumed thread or a reloaded tab shows them again from the reply's metadata."""
    sources = saved_sources(metadata)
    if sources:
        element = cl.CustomElement(name=SOURCES_ELEMENT, props=sources_props(sources, lang), display="inline")
        await element.send(reply_id, persist=False)
    details = metadata.get(DETAILS_KEY)
    if isinstance(details, dict):
        await send_details(reply_id, details_props(details, lang, describe(str(details.get("template")))))


async def offer_actions(reply: cl.Message, lang: str) -> None:
    """The last reply's buttons: regenerate it, export the conversation as Markdown or JSON (earlier replies lose
    theirs: regenerate is for the last reply only)."""
    for action in cl.user_session.get("actions") or []:
        if isinstance(action, cl.Action):  # a resumed chat's session comes back from the thread without them
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
