"""Changing the template files: checked before writing (a broken draft never reaches the folder), conflicts instead
of overwrites, every change in the history, restore, duplicate, delete; the chat's store sees each change at once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from backend.config import ROOT
from backend.errors import WorkshopError
from backend.prompts.store import TemplateStore
from backend.workshop.files import DraftRefused, TemplateFiles
from backend.workshop.versions import ABSENT, VersionStore, version_tag

POEM = "name: poem\npriority: 5\nkeywords: [poem]\nuser: 'A poem: {input}'\n"


@pytest.fixture
def files(tmp_path: Path) -> TemplateFiles:
    folder = Path(shutil.copytree(ROOT / "prompts", tmp_path / "prompts"))
    return TemplateFiles(folder, VersionStore(tmp_path / "history"))


def code(exc: pytest.ExceptionInfo[WorkshopError]) -> str | None:
    return exc.value.code


def test_create_save_and_the_chat_store_follows(files: TemplateFiles) -> None:
    chat = TemplateStore(files.folder)
    assert "poem" not in chat.names()
    first = files.create("poem", POEM, "alice", "first")
    assert (first.number, first.action, first.who, first.note) == (1, "created", "alice", "first")
    assert chat.route("a poem please").template == "poem"
    second = files.save("poem", POEM.replace("poem]", "poem, verse]"), first.tag, "bob", "more words")
    assert second.number == 2 and second.action == "saved"
    assert chat.route("some verse please").template == "poem", "picked up without a restart"
    with pytest.raises(WorkshopError) as again:
        files.create("poem", POEM, "alice")
    assert code(again) == "workshop.exists"


def test_a_draft_with_problems_is_refused_and_the_file_keeps_serving(files: TemplateFiles) -> None:
    saved = files.create("poem", POEM, "alice")
    chat = TemplateStore(files.folder)
    with pytest.raises(DraftRefused) as refused:
        files.save("poem", "name: poem\nuser: no placeholder\n", saved.tag, "alice")
    assert refused.value.code == "workshop.problems" and refused.value.params["count"] == 1
    assert refused.value.message.endswith(f"{refused.value.params['file']} keeps its current text.")
    assert [p.field for p in refused.value.problems] == ["user"]
    assert files.read("poem") == POEM
    assert chat.problems() == [] and chat.route("a poem").template == "poem"
    assert [v.number for v in files.history.history("poem")] == [1]
    with pytest.raises(DraftRefused) as new:
        files.create("other", "user: [\n", "alice")
    assert files.read("other") is None
    # never saved: no "last good version" to speak of; the message says the chat does not know it yet
    assert new.value.code == "workshop.problems_new" and "does not know this template yet" in new.value.message


def test_a_stale_base_is_a_conflict_naming_who_saved(files: TemplateFiles) -> None:
    first = files.create("poem", POEM, "alice")
    files.save("poem", POEM.replace("5", "6"), first.tag, "bob", "six")
    with pytest.raises(WorkshopError) as conflict:
        files.save("poem", POEM.replace("5", "7"), first.tag, "alice")
    assert code(conflict) == "workshop.conflict"
    assert conflict.value.params["who"] == "bob" and conflict.value.params["name"] == "poem"
    assert "priority: 6" in (files.read("poem") or ""), "bob's version stays"
    with pytest.raises(WorkshopError) as new_over_old:
        files.save("poem", POEM, ABSENT, "carol")  # "new file" while one exists
    assert code(new_over_old) == "workshop.conflict"


def test_an_edit_by_hand_is_kept_in_the_history_and_is_a_conflict(files: TemplateFiles) -> None:
    first = files.create("poem", POEM, "alice")
    (files.folder / "poem.yaml").write_text(POEM.replace("5", "8"), encoding="utf-8")
    with pytest.raises(WorkshopError) as conflict:
        files.save("poem", POEM.replace("5", "9"), first.tag, "alice")
    assert conflict.value.params["who"] == "(outside the workshop)"
    files.save("poem", POEM.replace("5", "9"), version_tag(POEM.replace("5", "8")), "alice")
    actions = [(v.number, v.action) for v in files.history.history("poem")]
    assert actions == [(1, "created"), (2, "found"), (3, "saved")]
    assert files.history.text("poem", 2) == POEM.replace("5", "8")


def test_restore_duplicate_delete(files: TemplateFiles) -> None:
    first = files.create("poem", POEM, "alice")
    second = files.save("poem", POEM.replace("5", "6"), first.tag, "bob")
    restored = files.restore("poem", 1, second.tag, "alice")
    assert restored.action == "restored" and restored.note == "restored version 1" and files.read("poem") == POEM
    with pytest.raises(WorkshopError) as stale:
        files.restore("poem", 2, second.tag, "bob")
    assert code(stale) == "workshop.conflict"
    with pytest.raises(WorkshopError) as missing:
        files.restore("poem", 9, restored.tag, "bob")
    assert code(missing) == "workshop.no_version"

    copy = files.duplicate("poem", "poem-copy", "alice")
    assert copy.note == "copy of poem" and "name: poem-copy\n" in (files.read("poem-copy") or "")
    gone = files.delete("poem-copy", copy.tag, "alice")
    assert gone.action == "deleted" and files.read("poem-copy") is None
    back = files.restore("poem-copy", 1, ABSENT, "alice")  # a deleted template comes back from its history
    assert back.number == 3 and files.read("poem-copy") is not None

    with pytest.raises(WorkshopError) as keep:
        files.delete("default", version_tag(files.read("default")), "alice")
    assert code(keep) == "workshop.keep_default"
    for bad in ("../etc", "Poem", "a/b", ""):
        with pytest.raises(WorkshopError) as refused:
            files.read(bad)
        assert code(refused) == "workshop.bad_name"
