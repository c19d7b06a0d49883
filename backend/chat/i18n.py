"""The chat's own words in the browser's language (English or Simplified Chinese), from the one catalogue.

The texts are data in backend/catalogue.yaml (its `chat` section; backend.catalogue.MESSAGES). Errors are rendered by
`describe` (one text) or `describe_parts` (message and hint apart) from the catalogue's `errors` section; an error
without a catalogue code is shown in English."""

from __future__ import annotations

from typing import Any

from backend.catalogue import MESSAGES, lang_of
from backend.errors import ServiceError

__all__ = ["MESSAGES", "describe", "describe_parts", "lang_of", "t"]


def t(key: str, locale: str | None, **params: Any) -> str:
    """The message `key` in the language of `locale`, formatted with `params`."""
    entry = MESSAGES[key]
    return entry.get(lang_of(locale), entry["en"]).format(**params)


def describe(error: BaseException | str | None, locale: str | None) -> str:
    """An error as the user reads it, message and hint, in the language of `locale` when the catalog has it.

    For t("error", ..., error=describe(exc, locale)) and the other messages that show an error."""
    if error is None:
        return ""
    if isinstance(error, ServiceError):
        return error.text(locale)
    return str(error)


def describe_parts(error: BaseException | str | None, locale: str | None) -> tuple[str, str]:
    """(message, hint) of an error in the language of `locale`, for messages that show them apart (t("failed"))."""
    if isinstance(error, ServiceError):
        return error.localized(locale)
    return ("" if error is None else str(error)), ""
