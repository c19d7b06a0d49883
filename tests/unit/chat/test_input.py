"""Cleaning user input before it reaches the engine."""

from __future__ import annotations

import pytest

from backend.chat.request import clean_input
from backend.errors import InvalidInputError


@pytest.mark.parametrize(
    "text", ["", "   ", "\n\t \n", "\x00\x01", "   \u200b\u200b   ", "\u200c\u200d\u2060\ufeff", "\u3000\u200b"]
)
def test_empty_or_whitespace_is_refused(text: str) -> None:
    with pytest.raises(InvalidInputError, match="empty"):
        clean_input(text, 100)


def test_control_characters_removed_newlines_kept() -> None:
    assert clean_input("a\x00b\x1bc\nd\te\x7f", 100) == "abc\nd\te"


def test_invalid_unicode_is_replaced() -> None:
    assert clean_input("ok \ud800 fine", 100) == "ok ? fine"


def test_oversized_message_is_refused_with_numbers() -> None:
    with pytest.raises(InvalidInputError) as err:
        clean_input("x" * 1001, 1000)
    assert err.value.params == {"chars": 1001, "limit": 1000}


def test_zero_width_characters_inside_a_real_message_are_kept() -> None:
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # an emoji joined by zero-width joiners
    assert clean_input(f" {family} hi\u200b", 100) == f" {family} hi\u200b"
