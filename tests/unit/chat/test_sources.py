"""Passages of the user's documents in the chat's messages: how they are written into the user message, left out of
an export again (the history keeps them, as the model saw them), kept with a reply and read back when a saved thread
is opened again."""

from __future__ import annotations

import json

from backend.chat.render import SOURCES_KEY, export, saved_sources
from backend.chat.saved import step_metadata
from backend.chat.sources import Source, asked, with_sources

VAULT = Source(1, "vault.md", "d1", 0, "The vault code is K7-31.", heading="Vault")
MAP = Source(2, "map.pdf", "d2", 4, "保险库在北楼。", page=3)


def test_the_question_is_read_back_from_a_message_with_passages_in_both_languages() -> None:
    for question in ("What is the vault code?", "保险库的密码是什么？"):
        sent = with_sources(question, [VAULT, MAP])
        assert "[1] vault.md, Vault\nThe vault code is K7-31." in sent and "[2] map.pdf, p. 3\n保险库在北楼。" in sent
        assert sent.endswith(question) and asked(sent) == question
    assert with_sources("Hello", []) == "Hello"


def test_a_message_without_passages_is_its_own_question() -> None:
    for text in ("Question: what is this?", "Passages from the user's documents: none\nQuestion: x", ""):
        assert asked(text) == text


def test_an_export_shows_the_question_and_the_history_keeps_what_the_model_saw() -> None:
    sent = with_sources("What is the vault code?", [VAULT])
    history = [{"role": "user", "content": sent}, {"role": "assistant", "content": "K7-31 [1]"}]
    markdown = export(history, "md", "en-US")
    assert "What is the vault code?" in markdown and "K7-31 [1]" in markdown
    assert "The vault code is K7-31." not in markdown
    messages = json.loads(export(history, "json", "en-US"))["messages"]
    assert messages == [{"role": "user", "content": "What is the vault code?"}, history[1]]
    assert history[0]["content"] == sent, "the history itself is not changed"


def test_a_replys_sources_are_read_back_from_its_saved_metadata() -> None:
    saved = {SOURCES_KEY: [VAULT.saved(), MAP.saved()], "other": 1}
    step = {"metadata": json.dumps(saved)}  # SQLite gives JSON columns back as text
    assert saved_sources(step_metadata(step)) == [VAULT, MAP]
    assert saved_sources({}) == [] and saved_sources({SOURCES_KEY: "broken"}) == []
    assert saved_sources({SOURCES_KEY: [{"number": 1}, VAULT.saved()]}) == [VAULT], "an unreadable one is left out"
