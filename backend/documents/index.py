"""The documents' index in the app's database (SQLite or PostgreSQL, the same statements): each document with its
bytes, its passages, and each passage's terms with their counts, which a question's BM25 score is computed from.

Every statement names the owner: one user's documents are never read for another's question. Deleting a document
deletes its passages and terms with it (foreign keys), and on SQLite the freed pages are overwritten (secure_delete),
so its text does not stay in the file."""

from __future__ import annotations

import math
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, event, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from backend.documents.passages import Passage
from backend.documents.terms import query_terms, term_counts
from backend.errors import StorageError
from backend.storage.database import migrate_database, open_engine, redact, storage_error

K1, B = 1.2, 0.75  # BM25's usual constants
PASSAGES_PER_BATCH = 50


@dataclass(frozen=True)
class DocumentInfo:
    """A document of a library, as listed."""

    id: str
    name: str
    kind: str
    size: int
    passages: int
    created_at: str

    def json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "kind": self.kind, "size": self.size, "passages": self.passages,
                "created_at": self.created_at}  # fmt: skip


@dataclass(frozen=True)
class Hit:
    """A passage found for a question, with its score (higher is better)."""

    document_id: str
    document: str
    number: int
    text: str
    page: int | None
    heading: str | None
    score: float


def _secure_delete(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA secure_delete = ON")  # a deleted document's pages are overwritten with zeros
    finally:
        cursor.close()


def bm25(
    postings: list[tuple[tuple[str, int], str, int]],
    lengths: dict[tuple[str, int], int],
    df: dict[str, int],
    n: int,
    avgdl: float,
) -> dict[tuple[str, int], float]:
    """BM25 scores of the passages that hold a query term: postings are (passage, term, count in the passage)."""
    scores: dict[tuple[str, int], float] = defaultdict(float)
    for key, term, tf in postings:
        idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
        norm = tf + K1 * (1 - B + B * lengths[key] / max(avgdl, 1.0))
        scores[key] += idf * tf * (K1 + 1) / norm
    return scores


class DocumentIndex:
    """The documents' tables of the app's database, one transaction per call."""

    def __init__(self, url: str) -> None:
        self.where = redact(url)
        self.engine: AsyncEngine = open_engine(url, immediate=True)
        self.dialect = self.engine.dialect.name
        if self.dialect == "sqlite":
            event.listen(self.engine.sync_engine, "connect", _secure_delete)

    async def prepare(self) -> int:
        """Bring the schema up to date (documents are schema version 4); raise StorageError."""
        return await migrate_database(self.engine, self.where)

    async def close(self) -> None:
        await self.engine.dispose()

    async def _run(self, work: Any) -> Any:
        try:
            async with self.engine.begin() as conn:
                return await work(conn)
        except (SQLAlchemyError, OSError) as exc:
            raise storage_error(exc, self.where, "saving") from exc

    async def add(self, owner: str, name: str, kind: str, content: bytes, passages: list[Passage]) -> DocumentInfo:
        """Keep a document, its passages and their terms, in one transaction."""
        doc_id = uuid.uuid4().hex
        now = datetime.now(UTC).isoformat(timespec="seconds")

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(
                text('INSERT INTO documents ("id", "owner", "name", "kind", "size", "passages", "created_at", '
                     '"expires_at", "content") VALUES (:id, :o, :name, :kind, :size, :count, :at, :exp, :content)'),
                {"id": doc_id, "o": owner, "name": name, "kind": kind, "size": len(content), "count": len(passages),
                 "at": now, "exp": None, "content": content},
            )  # fmt: skip
            # A batch of passages at a time: the rows of a large document's terms are never all held at once.
            for start in range(0, len(passages), PASSAGES_PER_BATCH):
                rows, terms = [], []
                for p in passages[start : start + PASSAGES_PER_BATCH]:
                    counts = term_counts(p.text)
                    rows.append({"d": doc_id, "n": p.number, "o": owner, "p": p.page, "h": p.heading, "t": p.text,
                                 "l": sum(counts.values())})  # fmt: skip
                    terms += [{"d": doc_id, "n": p.number, "o": owner, "term": t, "tf": c} for t, c in counts.items()]
                await conn.execute(
                    text('INSERT INTO document_passages ("document_id", "number", "owner", "page", "heading", "text", '
                         '"length") VALUES (:d, :n, :o, :p, :h, :t, :l)'),
                    rows,
                )  # fmt: skip
                await conn.execute(
                    text('INSERT INTO document_terms ("document_id", "number", "owner", "term", "tf") '
                         "VALUES (:d, :n, :o, :term, :tf)"),
                    terms,
                )  # fmt: skip

        await self._run(work)
        return DocumentInfo(doc_id, name, kind, len(content), len(passages), now)

    async def documents(self, owner: str) -> list[DocumentInfo]:
        """The owner's documents, oldest first."""

        async def work(conn: AsyncConnection) -> list[DocumentInfo]:
            rows = await conn.execute(
                text('SELECT "id", "name", "kind", "size", "passages", "created_at" FROM documents '
                     'WHERE "owner" = :o ORDER BY "created_at", "name"'),
                {"o": owner},
            )  # fmt: skip
            return [DocumentInfo(*row) for row in rows]

        found: list[DocumentInfo] = await self._run(work)
        return found

    async def content(self, owner: str, doc_id: str) -> tuple[str, bytes] | None:
        """The document's name and bytes, if the owner has it."""

        async def work(conn: AsyncConnection) -> tuple[str, bytes] | None:
            row = (
                await conn.execute(
                    text('SELECT "name", "content" FROM documents WHERE "owner" = :o AND "id" = :id'),
                    {"o": owner, "id": doc_id},
                )
            ).first()
            return (str(row[0]), bytes(row[1])) if row else None

        found: tuple[str, bytes] | None = await self._run(work)
        return found

    async def delete(self, owner: str, doc_id: str) -> bool:
        """Delete the owner's document with its passages and terms; False if the owner has no such document."""

        async def work(conn: AsyncConnection) -> bool:
            params = {"o": owner, "id": doc_id}
            # Children first: PostgreSQL and SQLite both cascade, but explicit deletes need no foreign-key setting.
            await conn.execute(text('DELETE FROM document_terms WHERE "owner" = :o AND "document_id" = :id'), params)
            await conn.execute(text('DELETE FROM document_passages WHERE "owner" = :o AND "document_id" = :id'), params)
            gone = await conn.execute(text('DELETE FROM documents WHERE "owner" = :o AND "id" = :id'), params)
            return bool(gone.rowcount)

        deleted: bool = await self._run(work)
        return deleted

    async def delete_owner(self, owner: str) -> int:
        """Delete all of the owner's documents; returns how many there were."""
        ids = [doc.id for doc in await self.documents(owner)]
        for doc_id in ids:
            await self.delete(owner, doc_id)
        return len(ids)

    async def expire(self, now: float) -> int:
        """Delete the documents whose time is up (those of browser tabs gone without login); returns how many."""

        async def work(conn: AsyncConnection) -> list[tuple[str, str]]:
            rows = await conn.execute(
                text('SELECT "owner", "id" FROM documents WHERE "expires_at" IS NOT NULL AND "expires_at" < :now'),
                {"now": now},
            )
            return [(str(o), str(i)) for o, i in rows]

        expired: list[tuple[str, str]] = await self._run(work)
        for owner, doc_id in expired:
            await self.delete(owner, doc_id)
        return len(expired)

    async def keep_until(self, owner: str, expires_at: float | None) -> None:
        """Set when the owner's documents expire (None: not while the owner is there)."""

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(text('UPDATE documents SET "expires_at" = :exp WHERE "owner" = :o'),
                               {"exp": expires_at, "o": owner})  # fmt: skip

        await self._run(work)

    async def keep_unclaimed(self, prefixes: tuple[str, ...], expires_at: float) -> None:
        """Give the documents of owners whose names start with one of `prefixes` and that have no time set yet
        (left by an app process that stopped) until `expires_at`."""

        async def work(conn: AsyncConnection) -> None:
            for prefix in prefixes:
                await conn.execute(
                    text('UPDATE documents SET "expires_at" = :exp WHERE "expires_at" IS NULL AND "owner" LIKE :p'),
                    {"exp": expires_at, "p": prefix + "%"},
                )

        await self._run(work)

    async def search(self, owner: str, question: str, count: int) -> list[Hit]:
        """The owner's `count` passages that score best for the question (BM25 on its terms), best first."""
        wanted = query_terms(question)
        if not wanted or count <= 0:
            return []

        async def work(conn: AsyncConnection) -> list[Hit]:
            total = (
                await conn.execute(
                    text('SELECT COUNT(*), AVG("length") FROM document_passages WHERE "owner" = :o'), {"o": owner}
                )
            ).first()
            n, avgdl = int(total[0] or 0) if total else 0, float(total[1] or 0) if total else 0.0
            if n == 0:
                return []
            postings_sql = text(
                'SELECT t."document_id", t."number", t."term", t."tf", p."length" FROM document_terms t '
                'JOIN document_passages p ON p."document_id" = t."document_id" AND p."number" = t."number" '
                'WHERE t."owner" = :o AND t."term" IN :terms'
            ).bindparams(bindparam("terms", expanding=True))
            rows = (await conn.execute(postings_sql, {"o": owner, "terms": wanted})).all()
            df: dict[str, int] = defaultdict(int)
            lengths: dict[tuple[str, int], int] = {}
            postings = []
            for doc_id, number, term, tf, length in rows:
                key = (str(doc_id), int(number))
                df[term] += 1
                lengths[key] = int(length)
                postings.append((key, str(term), int(tf)))
            scores = bm25(postings, lengths, df, n, avgdl)
            best = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:count]
            hits = []
            for (doc_id, number), score in best:
                row = (
                    await conn.execute(
                        text('SELECT d."name", p."text", p."page", p."heading" FROM document_passages p '
                             'JOIN documents d ON d."id" = p."document_id" '
                             'WHERE p."owner" = :o AND p."document_id" = :id AND p."number" = :n'),
                        {"o": owner, "id": doc_id, "n": number},
                    )
                ).first()  # fmt: skip
                if row is not None:
                    hits.append(Hit(doc_id, str(row[0]), number, str(row[1]), row[2], row[3], score))
            return hits

        found: list[Hit] = await self._run(work)
        return found


__all__ = ["DocumentIndex", "DocumentInfo", "Hit", "StorageError"]
