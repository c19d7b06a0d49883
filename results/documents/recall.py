"""Recall of the answering passage in the top k, for each way of cutting and finding passages that was tried, on the
committed question set (questions.jsonl: 45 English and 21 Chinese questions over tests/documents_corpus/, each with
a piece of the passage that answers it). All six documents are in one library, as one user's would be.

    .venv/bin/python results/documents/recall.py > results/documents/recall.md

Options: BM25 over the app's terms (a Latin word, a pair of neighbouring Chinese characters: backend.documents.terms),
through the app's own index in an SQLite file (DocumentIndex.search, what the chat uses); the same with single Chinese
characters instead of pairs; SQLite FTS5 with its trigram tokenizer and its bm25() ranking; each at three passage
sizes. A question counts as found at k when one of the k best passages holds its answer (white space folded)."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import statistics
import sys
import tempfile
import time
import unicodedata
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from backend.chat.context import estimate_tokens  # noqa: E402
from backend.documents import terms as app_terms  # noqa: E402
from backend.documents.extract import extract  # noqa: E402
from backend.documents.index import DocumentIndex, bm25  # noqa: E402
from backend.documents.passages import Passage, passages  # noqa: E402

CORPUS = ROOT / "tests" / "documents_corpus"
QUESTIONS = Path(__file__).with_name("questions.jsonl")
SIZES = (300, 600, 1000)
KS = (1, 3, 5)


def folded(text: str) -> str:
    return " ".join(text.split())


def load() -> tuple[dict[str, list], list[dict]]:
    docs = {path.name: extract(path.name, path.read_bytes()) for path in sorted(CORPUS.iterdir())}
    questions = [json.loads(line) for line in QUESTIONS.read_text(encoding="utf-8").splitlines() if line.strip()]
    for q in questions:
        whole = folded("\n".join(s.text for s in docs[q["document"]]))
        assert folded(q["answer"]) in whole, f"answer not in {q['document']}: {q['answer']}"
    return docs, questions


def unigram_terms(text: str) -> list[str]:
    found: list[str] = []
    for run in app_terms.WORD.findall(unicodedata.normalize("NFKC", text).casefold()):
        found += list(run) if app_terms.CJK.match(run) else [run]
    return found


def in_memory(chunks: list[tuple[str, Passage]], tokenize) -> callable:
    """BM25 over `tokenize`'s terms, computed as the app's index computes it (index.bm25)."""
    counts = [Counter(tokenize(p.text)) for _, p in chunks]
    lengths = {(i, 0): sum(c.values()) for i, c in enumerate(counts)}
    avgdl = statistics.mean(lengths.values())

    def search(question: str, k: int) -> list[int]:
        wanted = list(dict.fromkeys(tokenize(question)))
        postings = [((i, 0), t, c[t]) for i, c in enumerate(counts) for t in wanted if t in c]
        df = Counter(t for _, t, _ in postings)
        scores = bm25(postings, lengths, df, len(chunks), avgdl)
        return [i for (i, _), _ in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]

    return search


def fts5_trigram(chunks: list[tuple[str, Passage]]) -> callable:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE p USING fts5(text, tokenize='trigram')")
    db.executemany("INSERT INTO p(rowid, text) VALUES (?, ?)", [(i, p.text) for i, (_, p) in enumerate(chunks)])

    def search(question: str, k: int) -> list[int]:
        words = re.findall(r"[0-9A-Za-z]{3,}|[\u3400-\u9fff]{3,}", question)
        grams = []
        for w in words:  # each word (Latin) or each 3-character piece of a Chinese run, OR-ed
            grams += [w] if w.isascii() else [w[i : i + 3] for i in range(len(w) - 2)]
        if not grams:
            return []
        query = " OR ".join('"' + g.replace('"', "") + '"' for g in dict.fromkeys(grams))
        rows = db.execute("SELECT rowid FROM p WHERE p MATCH ? ORDER BY bm25(p) LIMIT ?", (query, k)).fetchall()
        return [r[0] for r in rows]

    return search


async def through_index(chunks: list[tuple[str, Passage]], by_doc: dict[str, list[Passage]]) -> callable:
    """The app's own index (an SQLite file), the chat's search: returns a search function and closes nothing."""
    folder = tempfile.mkdtemp()
    index = DocumentIndex(f"sqlite+aiosqlite:///{folder}/recall.db")
    await index.prepare()
    ids = {}
    for name, found in by_doc.items():
        info = await index.add("user:recall", name, "text", b"", found)
        ids[info.id] = name
    where = {(name, p.number): i for i, (name, p) in enumerate(chunks)}

    async def search(question: str, k: int) -> list[int]:
        hits = await index.search("user:recall", question, k)
        return [where[(ids[h.document_id], h.number)] for h in hits]

    return search, index


def score(chunks, questions, results) -> dict:
    out = {}
    for lang in ("en", "zh", "all"):
        chosen = [(q, r) for q, r in zip(questions, results, strict=True) if lang in ("all", q["lang"])]
        for k in KS:
            hits = sum(any(folded(q["answer"]) in folded(chunks[i][1].text) for i in r[:k]) and True for q, r in chosen)
            out[f"{lang}@{k}"] = hits / len(chosen)
        out[f"{lang}_n"] = len(chosen)
    top3 = [sum(estimate_tokens([{"role": "user", "content": chunks[i][1].text}]) for i in r[:3]) for r in results]
    out["tokens_top3"] = statistics.mean(top3)
    return out


async def main() -> None:
    docs, questions = load()
    rows = []
    for size in SIZES:
        by_doc = {name: passages(sections, size) for name, sections in docs.items()}
        chunks = [(name, p) for name, found in by_doc.items() for p in found]
        options = {
            "BM25, words + Chinese pairs (the app's index)": None,
            "BM25, words + single Chinese characters": in_memory(chunks, unigram_terms),
            "SQLite FTS5 trigram, bm25()": fts5_trigram(chunks),
        }
        app_search, index = await through_index(chunks, by_doc)
        for name, search in options.items():
            started = time.perf_counter()
            if search is None:
                results = [await app_search(q["question"], max(KS)) for q in questions]
            else:
                results = [search(q["question"], max(KS)) for q in questions]
            ms = (time.perf_counter() - started) * 1000 / len(questions)
            rows.append((name, size, len(chunks), score(chunks, questions, results), ms))
        await index.close()
    print(
        "| option | passage chars | passages | en R@1 | en R@3 | en R@5 | zh R@1 | zh R@3 | zh R@5 |"
        " tokens of top 3 (estimate) | ms per question |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, size, n, s, ms in rows:
        cells = [f"{s[f'{lang}@{k}']:.2f}" for lang in ("en", "zh") for k in KS]
        print(f"| {name} | {size} | {n} | " + " | ".join(cells) + f" | {s['tokens_top3']:.0f} | {ms:.1f} |")
    en, zh = sum(q["lang"] == "en" for q in questions), sum(q["lang"] == "zh" for q in questions)
    print(f"\n{en} English and {zh} Chinese questions; R@k: the share whose answer is in one of the k best passages.")


if __name__ == "__main__":
    asyncio.run(main())
