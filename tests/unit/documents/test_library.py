"""The library on the app's database, SQLite and PostgreSQL alike: what one owner keeps is found for that owner only,
limits hold, a deleted document is gone from the index, a browser tab's documents go with it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import text

from backend.config import DocumentSettings
from backend.documents.index import DocumentIndex
from backend.documents.library import Library
from backend.errors import DocumentError
from tests.isolation import new_markers, shows

CORPUS = Path(__file__).resolve().parents[2] / "documents_corpus"


async def open_library(url: str, **settings: object) -> Library:
    index = DocumentIndex(url)
    await index.prepare()
    return Library(index, DocumentSettings(**settings), forget_after_s=60)  # type: ignore[arg-type]


async def count_rows(library: Library, table: str) -> int:
    async with library.index.engine.connect() as conn:
        return int((await conn.execute(text(f"SELECT COUNT(*) FROM {table}"))).scalar() or 0)


async def test_a_question_finds_its_passage_and_names_where_it_is(db_url: str) -> None:
    library = await open_library(db_url)
    try:
        for path in sorted(CORPUS.iterdir()):
            await library.add("user:alice", path.name, path.read_bytes())
        found = await library.find("user:alice", "Who deals with complaints about how an employee behaved?", 3)
        assert found[0].document == "ferry-handbook.md" and found[0].heading == "Complaints"
        assert "Tomas Brennick" in found[0].text and [s.number for s in found] == [1, 2, 3]
        zh = await library.find("user:alice", "冷藏库的温度是多少？", 1)
        assert "零下五度" in zh[0].text and zh[0].document == "茶叶合作社章程.md"
        listed = await library.documents("user:alice")
        assert len(listed) == 6 and all(d.passages > 0 for d in listed)
    finally:
        await library.close()


async def test_many_owners_at_once_never_find_each_others_documents(db_url: str) -> None:
    """The isolation test's way: many owners add a document with their own marker and ask at the same time; every
    passage anyone gets back holds their own marker, never another's."""
    library = await open_library(db_url)
    markers = new_markers(16)
    try:

        async def one(n: int, marker: str) -> list[str]:
            owner = f"user:u{n}" if n % 2 else f"tab:{'t' * 16}{n}"
            body = f"# Secret\nThe vault code of this owner is {marker}. The vault code opens the vault door."
            await library.add(owner, "secret.md", body.encode())
            found = await library.find(owner, "What is the vault code?", 5)
            return [s.text for s in found]

        results = await asyncio.gather(*(one(n, m) for n, m in enumerate(markers)))
        for own, texts in zip(markers, results, strict=True):
            assert texts and all(shows(t, own) for t in texts)
            assert not [m for m in markers if m != own and any(shows(t, m) for t in texts)]
    finally:
        await library.close()


async def test_deleting_a_document_removes_it_from_the_index(db_url: str) -> None:
    library = await open_library(db_url)
    try:
        info, _ = await library.add("user:bob", "a.md", b"# A\nThe heron nests by the lake.")
        await library.add("user:bob", "b.md", b"# B\nThe otter swims in the river.")
        before = await count_rows(library, "document_terms")
        await library.delete("user:bob", info.id)
        assert [d.name for d in await library.documents("user:bob")] == ["b.md"]
        assert all("heron" not in s.text for s in await library.find("user:bob", "heron lake", 3))
        assert 0 < await count_rows(library, "document_terms") < before
        assert await count_rows(library, "document_passages") == 1
        with pytest.raises(DocumentError) as caught:
            await library.delete("user:carol", (await library.documents("user:bob"))[0].id)  # not hers
        assert caught.value.code == "documents.not_found"
    finally:
        await library.close()


async def test_limits_of_size_count_and_text(db_url: str) -> None:
    library = await open_library(db_url, max_file_mb=0.001, max_documents=2, max_chars=1000)
    try:
        with pytest.raises(DocumentError) as caught:
            await library.add("user:dan", "big.txt", b"x " * 1000)
        assert caught.value.code == "documents.too_large" and "0.001 MB" in caught.value.text("en")
        _, cut = await library.add("user:dan", "a.txt", ("word " * 199).encode())
        assert not cut
        await library.add("user:dan", "b.txt", b"two")
        with pytest.raises(DocumentError) as full:
            await library.add("user:dan", "c.txt", b"three")
        assert full.value.code == "documents.library_full" and "2" in full.value.text("zh-CN")
    finally:
        await library.close()


async def test_a_tabs_documents_go_after_it_went_away(db_url: str) -> None:
    library = await open_library(db_url)
    try:
        await library.add("tab:aaaaaaaaaaaaaaaa", "a.md", b"kept while the tab is there")
        await library.add("user:erin", "b.md", b"a user's document stays")
        library.forget_after_s = -1  # gone at once
        await library.went_away("tab:aaaaaaaaaaaaaaaa")
        await library.went_away("user:erin")
        assert await library.expire() == 1
        assert await library.documents("tab:aaaaaaaaaaaaaaaa") == []
        assert len(await library.documents("user:erin")) == 1
    finally:
        await library.close()
