"""Errors a user can meet; their texts in English and Simplified Chinese are data, in backend/catalogue.yaml.

Every error says what happened (`message`) and what to do (`hint`); `str(exc)` is both. An error a chat user can
meet is built from a stable code and its parameters:

    raise EngineStartError.of("engine.port_in_use", port=8100, host="127.0.0.1")

formats the catalogue's CATALOG[code]["en"] (message, hint; backend.catalogue) with the parameters, and
`exc.localized("zh-CN")` (or `exc.text(...)`) formats CATALOG[code]["zh"] with the same ones; `exc.code` and
`exc.params` keep them. Errors that only ever reach a terminal (command-line tools, benchmarks) may stay free-form,
`ServiceError(message, hint)`, shown in English.

Parameters are shown as they are (numbers, paths, flags, an engine's or a driver's own words), except three kinds,
which are shown in the reader's language: a Phrase (a catalogued part of a sentence: a reason, a place), another
ServiceError (its message), and a list (its items, each shown so, joined by "; " or "；").

Above backend.catalogue, this module imports nothing else from backend.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Self

from backend.catalogue import CATALOG, PHRASES, lang_of


class Phrase:
    """A part of a sentence (a reason, a place) given as a parameter, shown in the reader's language.

    `str()` is the English text, so logs and English messages read as before."""

    __slots__ = ("code", "params")

    def __init__(self, code: str, /, **params: object) -> None:
        self.code = code
        self.params = params

    def text(self, locale: str | None = None) -> str:
        return _format(PHRASES[self.code][lang_of(locale)], params=self.params, lang=lang_of(locale))

    def __str__(self) -> str:
        return self.text("en")

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"Phrase({self.code!r}{args})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Phrase) and (self.code, self.params) == (other.code, other.params)

    def __hash__(self) -> int:
        return hash(self.code)


class _Missing(dict[str, object]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _shown(value: object, lang: str) -> object:
    """A parameter as the reader sees it: Phrases, ServiceErrors and lists in `lang`, anything else as it is."""
    if isinstance(value, Phrase):
        return value.text(lang)
    if isinstance(value, ServiceError):
        return value.localized(lang)[0]
    if isinstance(value, list):
        return ("；" if lang == "zh" else "; ").join(str(_shown(item, lang)) for item in value)
    return value


def _format(template: str, params: Mapping[str, object], lang: str) -> str:
    values = _Missing({key: _shown(value, lang) for key, value in params.items()})
    try:
        return template.format_map(values)
    except (ValueError, TypeError, IndexError, AttributeError):  # a parameter of the wrong type: show the template
        return template


def render(code: str, locale: str | None, params: Mapping[str, object]) -> tuple[str, str]:
    """(message, hint) of the catalogued error `code` in the language of `locale`, formatted with `params`."""
    lang = lang_of(locale)
    message, hint = CATALOG[code][lang]
    return _format(message, params, lang), _format(hint, params, lang)


def fields(template: str) -> set[str]:
    """The parameter names a catalog text uses (for the tests)."""
    return {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(template) if name}


class ServiceError(Exception):
    """Base of every error meant for a person: `str()` is the full message, `hint` what to do next."""

    #: the kind of error, as counted in the metrics (backend.ops.metrics)
    key = "error.generic"
    #: the catalog code it was made from (`of`), None for a free-form (English-only) error
    code: str | None = None

    def __init__(self, message: str, hint: str = "", **params: object) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.params = params

    @classmethod
    def of(cls, code: str, /, **params: object) -> Self:
        """The error `code` of the catalog, its English message and hint formatted with `params`."""
        message, hint = render(code, "en", params)
        exc = cls(message, hint, **params)
        exc.code = code
        exc.params = dict(params)
        return exc

    def translated(self, locale: str | None) -> bool:
        """Whether the catalog has this error's text in the language of `locale` (other than English)."""
        return self.code is not None and self.code in CATALOG and lang_of(locale) != "en"

    def localized(self, locale: str | None = None) -> tuple[str, str]:
        """(message, hint) in the language of `locale`; English when the catalog has no text for this error."""
        if self.code is not None and self.translated(locale):
            return render(self.code, locale, self.params)
        return self.message, self.hint

    def text(self, locale: str | None = None) -> str:
        """The message and hint in the language of `locale`, as one text (Chinese puts no space between them)."""
        message, hint = self.localized(locale)
        return (message + ("" if self.translated(locale) else " ") + hint).strip()

    def __str__(self) -> str:
        return f"{self.message} {self.hint}".strip()


class ConfigError(ServiceError):
    """The configuration file or an environment override holds an invalid value."""

    key = "error.config"


class ModelNotFoundError(ServiceError):
    """No usable model: not a local folder, not in the cache, and the hub is out of reach."""

    key = "error.model"


class ModelConversionError(ModelNotFoundError):
    """The model could not be converted to the format the engine needs (GGUF for llama.cpp)."""


class EngineNotInstalledError(ServiceError):
    """The chosen engine's program or Python package is missing."""

    key = "error.engine_missing"


class EngineStartError(ServiceError):
    """The engine exited or never became ready during start-up."""

    key = "error.engine_start"

    def __init__(
        self, message: str, hint: str = "", exit_code: int | None = None, log_tail: str = "", **params: object
    ) -> None:
        super().__init__(message, hint, **params)
        self.exit_code = exit_code
        self.log_tail = log_tail


class CanaryError(ServiceError):
    """No way to run the engine on this machine gives answers that match the float32 reference."""

    key = "error.canary"


class BackendUnavailableError(ServiceError):
    """The engine is not ready (starting, restarting, or given up) when a reply is asked for."""

    key = "error.unavailable"


class BackendError(ServiceError):
    """The engine answered with an error or the connection broke during a reply."""

    key = "error.backend"


class PromptTooLongError(ServiceError):
    """The newest message alone does not fit in the model's context window."""

    key = "error.too_long"


class InvalidInputError(ServiceError):
    """The message cannot be sent as it is (empty, too large, or naming a template that does not exist)."""

    key = "error.input"


class StorageError(ServiceError):
    """The conversation database cannot be used; the chat works without history."""

    key = "error.storage"


class UsersFileError(ServiceError):
    """The users file (or ERNIE_AUTH__USERS) cannot be read; nobody can log in until it is fixed."""

    key = "error.users"


class WorkshopError(ServiceError):
    """A change in the template workshop was refused: not allowed, a conflict, a draft with problems, a bad name."""

    key = "error.workshop"


class ApiError(ServiceError):
    """A request to the OpenAI-compatible API was refused: the API is off, no valid key, a request it cannot take."""

    key = "error.api"


class QuotaError(ServiceError):
    """A user is over one of their quotas (concurrent requests, requests per minute, tokens per day)."""

    key = "error.quota"

    @property
    def retry_after_s(self) -> int:
        """Seconds until the request may be tried again (the API's Retry-After)."""
        return max(1, int(str(self.params.get("retry_s", 1))))


class ServerFullError(ServiceError):
    """The line in front of the engine is full (backend.chat.admission): try again later."""

    key = "error.full"

    @property
    def retry_after_s(self) -> int:
        """Seconds until a place is expected to be free (the API's Retry-After)."""
        return max(1, int(str(self.params.get("retry_s", 1))))


class ServerRestartingError(ServerFullError):
    """The app is draining for a restart: nothing new is taken in."""

    key = "error.restarting"


class LoginThrottledError(QuotaError):
    """Too many failed logins for one name or from one address: the next attempt waits (retry_after_s)."""

    key = "error.login"


class RequestRefusedError(ServiceError):
    """A request refused before it reaches a page or the API: made by another site's page, too large, or asking for
    what only this machine may read."""

    key = "error.request"


class BenchmarkError(ServiceError):
    """The benchmark cannot run as asked (bad option, server not reachable, engine or baseline failed)."""

    key = "error.benchmark"


class DocumentError(ServiceError):
    """A document cannot be taken into a library (its kind, size, or no text in it), or is not there."""

    key = "error.document"


class SignInError(ServiceError):
    """A sign-in through the organisation's provider or a sign-in proxy failed: refused there, a token that does not
    verify, a browser that did not start it, or a user this app may not let in."""

    key = "error.sign_in"
