"""Each owner's library of documents: taking a file in (its limits, its text, its passages), listing, deleting, and
finding the passages that answer a question (the chat's Finder, backend.chat.sources).

An owner is a login user ("user:NAME") or, without login, a browser tab ("tab:ID"): a tab's documents go with it,
`tab_memory_s` after its last page went away (as its chat does, backend.web.replies), and at the app's next start."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import PurePath

from backend.chat.sources import Source
from backend.config import AppConfig, DocumentSettings
from backend.documents.extract import KINDS, extract, kind_of
from backend.documents.index import DocumentIndex, DocumentInfo
from backend.documents.passages import passages
from backend.errors import DocumentError
from backend.storage.persistence import app_database_url

log = logging.getLogger(__name__)

MB = 1024 * 1024
ANONYMOUS = ("tab:", "session:")  # owners without login: their documents expire


def max_bytes(settings: DocumentSettings) -> int:
    """The largest file the library takes, in bytes."""
    return int(settings.max_file_mb * MB)


def anonymous(owner: str) -> bool:
    return owner.startswith(ANONYMOUS)


class Library:
    """The documents of every owner, in the app's database (DocumentIndex)."""

    def __init__(self, index: DocumentIndex, settings: DocumentSettings, forget_after_s: float) -> None:
        self.index = index
        self.settings = settings
        self.forget_after_s = forget_after_s
        self._adding: dict[str, asyncio.Lock] = {}  # one file at a time per owner: the count limit holds

    @classmethod
    async def open(cls, cfg: AppConfig) -> Library:
        """The library on the app's database, its schema up to date; StorageError when it cannot be opened. A
        browser tab's documents left by an earlier run are given `tab_memory_s` to be found again, then go."""
        index = DocumentIndex(app_database_url(cfg))
        await index.prepare()
        library = cls(index, cfg.documents, cfg.chat.tab_memory_s)
        await index.keep_unclaimed(ANONYMOUS, time.time() + library.forget_after_s)
        await library.expire()
        return library

    async def close(self) -> None:
        await self.index.close()

    def check(self, name: str, size: int) -> None:
        """Refuse a file the library would not take, by its name and size alone (DocumentError)."""
        if kind_of(name) is None:
            raise DocumentError.of("documents.bad_type", name=name, kinds=", ".join(KINDS))
        if size > max_bytes(self.settings):
            raise DocumentError.of("documents.too_large", name=name, limit_mb=f"{self.settings.max_file_mb:g}")

    async def add(self, owner: str, name: str, data: bytes) -> tuple[DocumentInfo, bool]:
        """Take a file into the owner's library: (what was kept, whether its text was cut at max_chars).
        DocumentError: its kind, its size, a full library, no text in it."""
        name = PurePath(name).name or "document"
        self.check(name, len(data))
        sections = await asyncio.to_thread(extract, name, data)
        cut = False
        total = 0
        kept = []
        for section in sections:
            room = self.settings.max_chars - total
            if room <= 0:
                cut = True
                break
            if len(section.text) > room:
                section, cut = type(section)(section.text[:room], section.page, section.heading), True
            kept.append(section)
            total += len(section.text)
        found = passages(kept, self.settings.passage_chars)
        lock = self._adding.setdefault(owner, asyncio.Lock())
        async with lock:
            if len(await self.index.documents(owner)) >= self.settings.max_documents:
                raise DocumentError.of("documents.library_full", limit=self.settings.max_documents)
            info = await self.index.add(owner, name, kind_of(name) or "text", data, found)
        log.info("Document kept: %d passages, %d bytes", info.passages, info.size)
        return info, cut

    async def documents(self, owner: str) -> list[DocumentInfo]:
        return await self.index.documents(owner)

    async def delete(self, owner: str, doc_id: str) -> None:
        """Delete the owner's document (DocumentError documents.not_found if there is none of that id)."""
        if not await self.index.delete(owner, doc_id):
            raise DocumentError.of("documents.not_found", id=doc_id)

    async def find(self, owner: str, question: str, count: int) -> list[Source]:
        """The owner's passages that best answer the question, best first, numbered from 1 (the chat's Finder)."""
        if anonymous(owner):
            await self.came_back(owner)  # a tab that asks is there (another app process may have set it to expire)
        hits = await self.index.search(owner, question, count)
        return [
            Source(n, hit.document, hit.document_id, hit.number, hit.text, hit.page, hit.heading)
            for n, hit in enumerate(hits, 1)
        ]

    async def went_away(self, owner: str) -> None:
        """The owner's last page went away: a browser tab's documents go `tab_memory_s` from now (unless it comes
        back: came_back)."""
        if anonymous(owner):
            await self.index.keep_until(owner, time.time() + self.forget_after_s)

    async def came_back(self, owner: str) -> None:
        """A page of the owner is there: its documents stay while it is."""
        if anonymous(owner):
            await self.index.keep_until(owner, None)

    async def expire(self) -> int:
        """Delete the documents of browser tabs gone for `tab_memory_s`."""
        gone = await self.index.expire(time.time())
        if gone:
            log.info("%d documents of browser tabs gone were deleted", gone)
        return gone
