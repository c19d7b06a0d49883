"""The OpenAI chat-completions request and response shapes this API takes and gives (the fields tools use)."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The message's text (the text parts of a multi-part content, joined)."""
        if isinstance(self.content, list):
            return "".join(str(part.get("text", "")) for part in self.content if part.get("type") == "text")
        return self.content or ""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class CompletionRequest(BaseModel):
    """POST /v1/chat/completions. Unknown fields (n, user, seed...) are accepted and not used."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    template: str | None = None  # our own field: the prompt template to answer with (else the model name's, or auto)
    documents: bool = False  # our own field: answer from the caller's documents (their library, docs/documents.md)
    # Passed to the engine as they are: OpenAI's, and two of vLLM's (llama.cpp's server reads ignore_eos too).
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    ignore_eos: bool | None = None
    min_tokens: int | None = Field(None, ge=0)

    def sampling(self) -> dict[str, Any]:
        """The settings the caller chose (the others come from the template and the config)."""
        values = {"temperature": self.temperature, "top_p": self.top_p,
                  "max_tokens": self.max_completion_tokens or self.max_tokens}  # fmt: skip
        return {key: value for key, value in values.items() if value is not None}

    def engine_options(self) -> dict[str, Any]:
        """The fields the engine takes as they are (stop, seed, penalties, ignore_eos, min_tokens), when given."""
        keys = ("stop", "seed", "presence_penalty", "frequency_penalty", "ignore_eos", "min_tokens")
        return {key: getattr(self, key) for key in keys if getattr(self, key) is not None}


def completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex


def usage_json(prompt_tokens: int, reply_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": reply_tokens,
            "total_tokens": prompt_tokens + reply_tokens}  # fmt: skip


def chunk_json(cid: str, model: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    """One streamed chunk (object chat.completion.chunk)."""
    return {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip


def usage_chunk_json(cid: str, model: str, prompt_tokens: int, reply_tokens: int) -> dict[str, Any]:
    """The last chunk when stream_options.include_usage: no choices, the usage."""
    return {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [], "usage": usage_json(prompt_tokens, reply_tokens)}  # fmt: skip


def completion_json(
    cid: str, model: str, text: str, finish: str, prompt_tokens: int, reply_tokens: int
) -> dict[str, Any]:
    """A whole reply (object chat.completion)."""
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": usage_json(prompt_tokens, reply_tokens)}  # fmt: skip


def models_json(names: list[str]) -> dict[str, Any]:
    listed = [{"id": name, "object": "model", "created": 0, "owned_by": "ernie-chat"} for name in names]
    return {"object": "list", "data": listed}


# OpenAI's error types, by the HTTP status the app answers with.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error"}  # fmt: skip


def error_json(status: int, code: str, message: str) -> dict[str, Any]:
    """An OpenAI-style error object carrying the app's error code."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": None,
                      "code": code}}  # fmt: skip
