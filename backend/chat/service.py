"""The chat service the UI talks to: one supervisor, one client, the templates, and request building."""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from backend.chat.client import ChatClient, Endpoint, Message
from backend.chat.context import estimate_tokens, fit_history
from backend.config import AppConfig, load_config
from backend.errors import InvalidInputError, PromptTooLongError
from backend.prompts.templates import RenderedPrompt, TemplateStore, UnknownTemplate
from backend.serving.launch import make_supervisor
from backend.serving.supervisor import Supervisor

log = logging.getLogger(__name__)

CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
SAMPLING_KEYS = ("temperature", "top_p", "max_tokens", "stop")
DEMO_KEYS = ("temperature", "top_p", "max_tokens", "frequency_penalty", "presence_penalty")
MIN_REPLY_TOKENS = 64
DEMO_REASON = "demo model: automatic templates are off"


@dataclass
class UserSettings:
    """Sampling settings one chat session chose; `changed` holds those the user moved from the defaults."""

    temperature: float
    top_p: float
    max_tokens: int
    template: str | None = None
    changed: set[str] = field(default_factory=set)

    @classmethod
    def defaults(cls, cfg: AppConfig, demo: bool = False) -> UserSettings:
        """The settings panel's starting values: the chat defaults, or the demo model's while it answers."""
        base = cfg.demo if demo else cfg.chat
        return cls(base.temperature, base.top_p, base.max_tokens)

    def update(self, values: dict[str, Any], cfg: AppConfig, demo: bool = False) -> None:
        """Apply values from the settings panel, remembering which differ from the configured defaults."""
        base = UserSettings.defaults(cfg, demo)
        for key in ("temperature", "top_p", "max_tokens"):
            if key in values and values[key] is not None:
                value = int(values[key]) if key == "max_tokens" else float(values[key])
                setattr(self, key, value)
                if value != getattr(base, key):
                    self.changed.add(key)
                else:
                    self.changed.discard(key)
        if "template" in values:
            name = values["template"]
            self.template = None if name in (None, "", "auto") else str(name)


@dataclass(frozen=True)
class ChatRequest:
    """What goes to the engine for one reply, and what the UI should tell the user about it."""

    messages: list[Message]
    sampling: dict[str, Any]
    template: str
    reason: str  # why this template: a keyword, a pattern, the user's choice
    user_text: str  # the rendered user message, as kept in the history
    prompt_tokens: int
    dropped: int


def clean_input(text: str, max_chars: int) -> str:
    """Return the message without control characters or invalid Unicode; refuse empty or oversized ones."""
    text = text.encode("utf-8", "replace").decode("utf-8")
    text = CONTROL_CHARS.sub("", text)
    if not text.strip():
        raise InvalidInputError("The message is empty.", "Type some text and send it again.")
    if len(text) > max_chars:
        raise InvalidInputError(
            f"The message has {len(text)} characters; at most {max_chars} are accepted.",
            "Send a shorter text.",
            chars=len(text),
            limit=max_chars,
        )
    return text


class ChatService:
    """Owns the engine supervisor, the single streaming client and the prompt templates."""

    def __init__(self, cfg: AppConfig, supervisor: Supervisor, client: ChatClient, templates: TemplateStore):
        self.cfg = cfg
        self.supervisor = supervisor
        self.client = client
        self.templates = templates
        self._max_model_len: int | None = None

    @classmethod
    def from_config(cls, cfg: AppConfig | None = None) -> ChatService:
        """Build the service; nothing starts until start()."""
        cfg = cfg or load_config()
        supervisor = make_supervisor(cfg)
        client = ChatClient(
            supervisor.endpoint,
            connect_timeout_s=cfg.timeouts.connect_s,
            read_timeout_s=cfg.timeouts.read_s,
            retries=cfg.restart.request_retries,
        )
        templates = TemplateStore(cfg.paths.resolve(cfg.paths.prompts_dir))
        return cls(cfg, supervisor, client, templates)

    @property
    def endpoint(self) -> Endpoint:
        return self.client.endpoint

    @property
    def serving_demo(self) -> bool:
        """Whether the offline demo model answers (known once the engine's model is resolved)."""
        spec = self.supervisor.spec
        return spec is not None and spec.demo

    def start(self) -> None:
        """Start the engine in the background (the chat says 'starting' until it is ready)."""
        self.supervisor.start_background()

    async def stop(self) -> None:
        await self.supervisor.stop()
        await self.client.aclose()

    async def context_window(self) -> int:
        """The model's context length as the server reports it (cached), or the configured one."""
        if self._max_model_len is None:
            reported = await self.client.max_model_len()
            self._max_model_len = reported or self.supervisor.flags.max_model_len or 4096
        return self._max_model_len

    async def _count(self, messages: list[Message]) -> int:
        counted = await self.client.count_tokens(messages)
        return counted if counted is not None else estimate_tokens(messages)

    def route(self, text: str, settings: UserSettings, demo: bool = False) -> RenderedPrompt:
        """Pick the template (a /name command, the session's choice, or routing) and render the message.

        With the demo model, messages no template was asked for go as they are (the default template)."""
        name, rest = self.templates.split_command(text)
        explicit = name or settings.template
        try:
            if demo and not explicit:
                return dataclasses.replace(self.templates.route(text, explicit="default"), reason=DEMO_REASON)
            return self.templates.route(rest if name else text, explicit=explicit)
        except UnknownTemplate as exc:
            raise InvalidInputError(str(exc), "Pick another template in the settings.") from exc

    async def build_request(self, history: list[Message], text: str, settings: UserSettings) -> ChatRequest:
        """Route the message, merge sampling settings and fit the conversation into the context window."""
        demo = self.serving_demo
        prompt = self.route(text, settings, demo)
        sampling: dict[str, Any]
        if demo:
            # The templates' prompts and sampling are written for ERNIE; the demo model does better without.
            sampling = {k: getattr(self.cfg.demo, k) for k in DEMO_KEYS}
            system = self.cfg.demo.system_prompt or self.cfg.chat.system_prompt
        else:
            sampling = {k: getattr(self.cfg.chat, k) for k in ("temperature", "top_p", "max_tokens")}
            sampling.update({k: v for k, v in prompt.sampling.items() if k in SAMPLING_KEYS and v is not None})
            system = prompt.system or self.cfg.chat.system_prompt
        sampling.update({k: getattr(settings, k) for k in settings.changed})
        window = await self.context_window()
        reserve = min(int(sampling["max_tokens"]), window // 2)
        new = {"role": "user", "content": prompt.user}
        try:
            fitted = await fit_history(history, new, self._count, window - reserve, system)
        except PromptTooLongError as exc:
            # A long message still goes through with a shorter reply, as long as some reply fits.
            least = min(MIN_REPLY_TOKENS, reserve)
            if int(str(exc.params.get("tokens", window))) > window - least:
                raise
            fitted = await fit_history(history, new, self._count, window - least, system)
        sampling["max_tokens"] = max(1, min(int(sampling["max_tokens"]), window - fitted.prompt_tokens))
        return ChatRequest(
            messages=fitted.messages,
            sampling=sampling,
            template=prompt.template,
            reason=prompt.reason,
            user_text=prompt.user,
            prompt_tokens=fitted.prompt_tokens,
            dropped=fitted.dropped,
        )
