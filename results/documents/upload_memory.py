"""The memory an upload of the largest allowed file costs the app's process: the file sent through the upload guard
to a route that reads it whole as Chainlit's does, then taken into the library (text, passages, the index on an
SQLite file), as a message with the file attached does. Peak resident memory above the start, from /proc.

    .venv/bin/python results/documents/upload_memory.py > results/documents/upload_memory.md
"""

from __future__ import annotations

import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Scope

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from backend.config import DocumentSettings  # noqa: E402
from backend.documents.index import DocumentIndex  # noqa: E402
from backend.documents.library import Library, max_bytes  # noqa: E402
from backend.documents.uploads import guard_uploads  # noqa: E402


def rss_kb() -> tuple[int, int]:
    """(resident now, peak resident) of this process, kB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def text_of(size: int) -> bytes:
    """English-like text of `size` bytes with a varied vocabulary (a large index)."""
    rng = random.Random(7)
    words = [f"w{n}" for n in range(20000)] + ["the", "of", "and", "ferry", "harbour", "ticket"] * 500
    out, total = [], 0
    while total < size:
        sentence = " ".join(rng.choice(words) for _ in range(12)) + ". "
        out.append(sentence)
        total += len(sentence)
    return "".join(out).encode()[:size]


async def main() -> None:
    settings = DocumentSettings()
    folder = Path(tempfile.mkdtemp())
    index = DocumentIndex(f"sqlite+aiosqlite:///{folder}/memory.db")
    await index.prepare()
    library = Library(index, settings, 60)
    data = text_of(max_bytes(settings))
    held: dict[str, bytes] = {}

    async def chainlit_upload(request: Request) -> JSONResponse:  # as Chainlit's route: the whole file in memory
        async with request.form() as form:
            held["file"] = await form["file"].read()  # type: ignore[union-attr]
        return JSONResponse({"id": "1"})

    async def check(scope: Scope) -> None:
        return None

    routes = [Route("/project/file", chainlit_upload, methods=["POST"])]
    guard_uploads(routes, max_bytes(settings), f"{settings.max_file_mb:g}", check)
    app = Starlette(routes=routes)
    files = {"file": ("big.txt", data, "text/plain")}
    request = httpx.Request("POST", "http://test/project/file?session_id=s", files=files)
    body = request.read()
    del files, request
    await asyncio.sleep(0)
    reset_peak()
    start, _ = rss_kb()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        boundary = body.split(b"\r\n", 1)[0][2:].decode()
        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        await client.post("/project/file?session_id=s", content=body, headers=headers)
    _, after_upload = rss_kb()
    started = time.perf_counter()
    info, cut = await library.add("user:memory", "big.txt", held.pop("file"))
    took = time.perf_counter() - started
    _, peak = rss_kb()
    await library.close()
    mb = 1024
    print("| what | MB |\n|---|---|")
    print(f"| file (documents.max_file_mb) | {len(data) / 1024 / 1024:.1f} |")
    rows = [
        ("resident before the upload (the multipart body built by the test client is already held)", start),
        ("peak above that: upload through the guard to a route that holds the file whole", after_upload - start),
        ("peak above that: the upload and taking it into the library", peak - start),
    ]
    for what, kb in rows:
        print(f"| {what} | {kb / mb:.0f} |")
    print(f"\n{info.passages} passages from {settings.max_chars:,} characters (cut: {cut}); took {took:.1f} s.")


if __name__ == "__main__":
    asyncio.run(main())
