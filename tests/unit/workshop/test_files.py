"""Changing the template files: checked before writing (a broken draft never reaches the folder), conflicts instead
of overwrites, every change in the history, restore, duplicate, delete; the chat's store sees each change at once."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from backend.config import ROOT
from backend.errors import WorkshopError
from backend.prompts.store import TemplateStore
from backend.workshop.files import DraftRefused, TemplateFiles
from backend.workshop.history import DatabaseHistory, FolderHistory, History
from backend.workshop.versions import ABSENT, VersionStore, version_tag
from tests.postgres_server import PostgresForTests

POEM = "name: poem\npriority: 5\nkeywords: [poem]\nuser: 'A poem: {input}'\n"


def database(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new database of `kind`: an SQLite file in tmp_path, or a database on the session's PostgreSQL server."""
    if kind == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'chat.db'}"
    postgres: PostgresForTests = request.getfixturevalue("postgres")
    return postgres.new_database()


@pytest_asyncio.fixture(params=["folder", "sqlite", "postgresql"])
async def files(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[TemplateFiles]:
    """The files with their history in the data folder (one app process), then in a database (several processes)."""
    folder = Path(shutil.copytree(ROOT / "prompts", tmp_path / "prompts"))
    if request.param == "folder":
        history: History = FolderHistory(VersionStore(tmp_path / "history"))
    else:
        history = DatabaseHistory(database(request.param, request, tmp_path))
    yield TemplateFiles(folder, history)
    await history.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_two_processes_on_one_database_share_the_lock_and_the_history(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Two app processes: one prompts folder, one database, each its own connections. Two editors who opened the
    same version save at once: one is saved, the other gets the conflict naming the first, as on one process."""
    folder = Path(shutil.copytree(ROOT / "prompts", tmp_path / "prompts"))
    url = database(kind, request, tmp_path)
    one, two = TemplateFiles(folder, DatabaseHistory(url)), TemplateFiles(folder, DatabaseHistory(url))
    try:
        first = await one.create("poem", POEM, "alice")
        results = await asyncio.gather(
            one.save("poem", POEM.replace("5", "6"), first.tag, "alice"),
            two.save("poem", POEM.replace("5", "7"), first.tag, "bob"),
            return_exceptions=True,
        )
        saved = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, WorkshopError)]
        assert len(saved) == 1 and len(refused) == 1, results
        winner = saved[0]
        assert refused[0].code == "workshop.conflict" and refused[0].params["who"] == winner.who
        assert [v.number for v in await two.history.versions("poem")] == [1, 2], "one history, seen by both"
        assert version_tag(one.read("poem")) == winner.tag
    finally:
        await one.history.close()
        await two.history.close()


def code(exc: pytest.ExceptionInfo[WorkshopError]) -> str | None:
    return exc.value.code


async def test_create_save_and_the_chat_store_follows(files: TemplateFiles) -> None:
    chat = TemplateStore(files.folder)
    assert "poem" not in chat.names()
    first = await files.create("poem", POEM, "alice", "first")
    assert (first.number, first.action, first.who, first.note) == (1, "created", "alice", "first")
    assert chat.route("a poem please").template == "poem"
    second = await files.save("poem", POEM.replace("poem]", "poem, verse]"), first.tag, "bob", "more words")
    assert second.number == 2 and second.action == "saved"
    assert chat.route("some verse please").template == "poem", "picked up without a restart"
    with pytest.raises(WorkshopError) as again:
        await files.create("poem", POEM, "alice")
    assert code(again) == "workshop.exists"


async def test_a_draft_with_problems_is_refused_and_the_file_keeps_serving(files: TemplateFiles) -> None:
    saved = await files.create("poem", POEM, "alice")
    chat = TemplateStore(files.folder)
    with pytest.raises(DraftRefused) as refused:
        await files.save("poem", "name: poem\nuser: no placeholder\n", saved.tag, "alice")
    assert refused.value.code == "workshop.problems" and refused.value.params["count"] == 1
    assert refused.value.message.endswith(f"{refused.value.params['file']} keeps its current text.")
    assert [p.field for p in refused.value.problems] == ["user"]
    assert files.read("poem") == POEM
    assert chat.problems() == [] and chat.route("a poem").template == "poem"
    assert [v.number for v in await files.history.versions("poem")] == [1]
    with pytest.raises(DraftRefused) as new:
        await files.create("other", "user: [\n", "alice")
    assert files.read("other") is None
    # never saved: no "last good version" to speak of; the message says the chat does not know it yet
    assert new.value.code == "workshop.problems_new" and "does not know this template yet" in new.value.message


async def test_a_stale_base_is_a_conflict_naming_who_saved(files: TemplateFiles) -> None:
    first = await files.create("poem", POEM, "alice")
    await files.save("poem", POEM.replace("5", "6"), first.tag, "bob", "six")
    with pytest.raises(WorkshopError) as conflict:
        await files.save("poem", POEM.replace("5", "7"), first.tag, "alice")
    assert code(conflict) == "workshop.conflict"
    assert conflict.value.params["who"] == "bob" and conflict.value.params["name"] == "poem"
    assert "priority: 6" in (files.read("poem") or ""), "bob's version stays"
    with pytest.raises(WorkshopError) as new_over_old:
        await files.save("poem", POEM, ABSENT, "carol")  # "new file" while one exists
    assert code(new_over_old) == "workshop.conflict"


async def test_an_edit_by_hand_is_kept_in_the_history_and_is_a_conflict(files: TemplateFiles) -> None:
    first = await files.create("poem", POEM, "alice")
    (files.folder / "poem.yaml").write_text(POEM.replace("5", "8"), encoding="utf-8")
    with pytest.raises(WorkshopError) as conflict:
        await files.save("poem", POEM.replace("5", "9"), first.tag, "alice")
    assert conflict.value.params["who"] == "(outside the workshop)"
    await files.save("poem", POEM.replace("5", "9"), version_tag(POEM.replace("5", "8")), "alice")
    actions = [(v.number, v.action) for v in await files.history.versions("poem")]
    assert actions == [(1, "created"), (2, "found"), (3, "saved")]
    assert await files.history.text("poem", 2) == POEM.replace("5", "8")


async def test_restore_duplicate_delete(files: TemplateFiles) -> None:
    first = await files.create("poem", POEM, "alice")
    second = await files.save("poem", POEM.replace("5", "6"), first.tag, "bob")
    restored = await files.restore("poem", 1, second.tag, "alice")
    assert restored.action == "restored" and restored.note == "restored version 1" and files.read("poem") == POEM
    with pytest.raises(WorkshopError) as stale:
        await files.restore("poem", 2, second.tag, "bob")
    assert code(stale) == "workshop.conflict"
    with pytest.raises(WorkshopError) as missing:
        await files.restore("poem", 9, restored.tag, "bob")
    assert code(missing) == "workshop.no_version"

    copy = await files.duplicate("poem", "poem-copy", "alice")
    assert copy.note == "copy of poem" and "name: poem-copy\n" in (files.read("poem-copy") or "")
    gone = await files.delete("poem-copy", copy.tag, "alice")
    assert gone.action == "deleted" and files.read("poem-copy") is None
    back = await files.restore("poem-copy", 1, ABSENT, "alice")  # a deleted template comes back from its history
    assert back.number == 3 and files.read("poem-copy") is not None

    with pytest.raises(WorkshopError) as keep:
        await files.delete("default", version_tag(files.read("default")), "alice")
    assert code(keep) == "workshop.keep_default"
    for bad in ("../etc", "Poem", "a/b", ""):
        with pytest.raises(WorkshopError) as refused:
            files.read(bad)
        assert code(refused) == "workshop.bad_name"


async def test_a_database_out_of_reach_is_a_clear_error_and_the_file_is_kept(tmp_path: Path) -> None:
    folder = Path(shutil.copytree(ROOT / "prompts", tmp_path / "prompts"))
    history = DatabaseHistory("postgresql+asyncpg://ernie:secret@127.0.0.1:1/ernie")  # nothing listens on port 1
    files = TemplateFiles(folder, history)
    before = files.read("default")
    try:
        with pytest.raises(WorkshopError) as failed:
            await files.save("default", POEM, version_tag(before), "alice")
    finally:
        await history.close()
    assert code(failed) == "workshop.history_failed" and "secret" not in failed.value.message
    assert "127.0.0.1:1" in failed.value.message and "storage.database_url" in (failed.value.hint or "")
    assert "storage.database_url" in failed.value.localized("zh-CN")[1]
    assert files.read("default") == before, "nothing was written"
