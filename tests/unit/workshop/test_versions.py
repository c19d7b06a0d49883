"""The version history: numbered versions with who/when/note, texts kept whole, outside edits noticed, atomic writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from backend.files import atomic_write
from backend.workshop.versions import ABSENT, VersionStore, unified_diff, version_tag


def test_versions_are_numbered_and_keep_their_text(tmp_path: Path) -> None:
    store = VersionStore(tmp_path / "history")
    assert store.history("poem") == [] and store.latest("poem") is None
    first = store.record("poem", "user: '{input}'\n", "alice", "first try", "created")
    second = store.record("poem", "user: 'Poem: {input}'\n", "bob", "", "saved")
    gone = store.record("poem", None, "bob", "deleted", "deleted")
    assert [v.number for v in store.history("poem")] == [1, 2, 3]
    assert (first.who, first.note, first.action) == ("alice", "first try", "created")
    assert second.tag == version_tag("user: 'Poem: {input}'\n") != first.tag
    assert gone.tag == ABSENT and store.text("poem", 3) is None
    assert store.text("poem", 1) == "user: '{input}'\n"
    assert store.latest("poem") == gone
    assert second.when.endswith("+00:00")  # UTC, ISO 8601


def test_an_outside_edit_is_recorded_once(tmp_path: Path) -> None:
    store = VersionStore(tmp_path)
    assert store.note_outside_change("poem", None) is None  # never seen, not there: nothing to keep
    found = store.note_outside_change("poem", "user: '{input}'\n")
    assert found is not None and found.action == "found" and found.number == 1
    assert store.note_outside_change("poem", "user: '{input}'\n") is None
    edited = store.note_outside_change("poem", "user: 'x {input}'\n")
    assert edited is not None and edited.note == "changed outside the workshop" and edited.number == 2


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "poem.yaml"
    path.write_text("old\n")
    before = path.stat().st_ino
    atomic_write(path, "new\n")
    assert path.read_text() == "new\n"
    assert path.stat().st_ino != before  # a new file moved into place, not the old one rewritten
    assert os.listdir(tmp_path) == ["poem.yaml"]


def test_a_failed_write_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "poem.yaml"
    path.write_text("old\n")

    def broken(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError) as failed:
        atomic_write(path, "new\n")
    assert failed.value.errno == 28, "the disk's own error reaches the caller"
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["poem.yaml"]


def test_unified_diff() -> None:
    diff = unified_diff("a\nb\n", "a\nc\n", "version 1", "current")
    assert diff.splitlines() == ["--- version 1", "+++ current", "@@ -1,2 +1,2 @@", " a", "-b", "+c"]
    assert unified_diff("same\n", "same\n", "x", "y") == ""
