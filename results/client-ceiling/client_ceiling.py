"""The app's own streaming path without an engine: how many streamed chunks one core of the app can take.

A stub server (its own process) streams vLLM-shaped chat chunks as fast as it can; the app's ChatClient reads
them with N concurrent streams. Measured: chunks per second of wall time, and the app process's CPU time per
chunk (less sensitive than wall time to whatever else runs on the machine). Client variants alternate A B A B.

usage: python results/client-ceiling/client_ceiling.py OUT.json [--streams 1,16,64] [--chunks 256] [--rounds 3]
           [--variants sdk,app]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from backend.benchmarks.stats import spread
from backend.chat.client import ChatClient
from backend.engines.base import Endpoint
from backend.serving.hardware import cpu_model

MODEL = "stub"


def chunk(text: str | None, finish: str | None = None) -> bytes:
    delta = {"content": text} if text is not None else {}
    body = {
        "id": "chatcmpl-0123456789abcdef",
        "object": "chat.completion.chunk",
        "created": 1764547200,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def serve(port: int, chunks: int) -> None:
    """The stub: every POST gets `chunks` one-token chunks, a finish, usage and [DONE], chunked encoding."""
    usage = {
        "id": "chatcmpl-0123456789abcdef",
        "object": "chat.completion.chunk",
        "created": 1764547200,
        "model": MODEL,
        "choices": [],
        "usage": {"prompt_tokens": 512, "completion_tokens": chunks, "total_tokens": 512 + chunks},
    }
    pieces = [chunk(" tok") for _ in range(chunks)]
    pieces += [chunk(None, "length"), b"data: " + json.dumps(usage).encode() + b"\n\n", b"data: [DONE]\n\n"]
    framed = [f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                )
                for i, piece in enumerate(framed):
                    writer.write(piece)
                    if i % 8 == 7:  # vLLM writes as its steps finish: several chunks per drain at most
                        await writer.drain()
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


async def measure(port: int, streams: int, total: int, variant: str) -> dict[str, float]:
    client = ChatClient(Endpoint(f"http://127.0.0.1:{port}", "k", MODEL), retries=0)
    received = 0
    messages = [{"role": "user", "content": "hi"}]

    async def one() -> None:
        nonlocal received
        if variant == "sdk":  # the path before 2026-12-01: the SDK's own stream of typed chunk objects
            stream = await client.openai.chat.completions.create(
                model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}, max_tokens=10_000
            )  # type: ignore[call-overload]
            async for piece in stream:
                if piece.choices and piece.choices[0].delta and piece.choices[0].delta.content:
                    received += 1
            await stream.close()
            return
        async with client.stream(messages, max_tokens=10_000) as reply:
            async for _ in reply:
                received += 1

    async def worker(jobs: list[int]) -> None:
        while jobs:
            jobs.pop()
            await one()

    await asyncio.gather(*(worker([0]) for _ in range(streams)))  # warm the connections
    received = 0
    jobs = list(range(total))
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(jobs) for _ in range(streams)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await client.aclose()
    return {"chunks": received, "chunks_per_s": received / wall, "cpu_us_per_chunk": cpu / received * 1e6}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--streams", default="1,16,64")
    parser.add_argument("--chunks", type=int, default=256, help="chunks per reply")
    parser.add_argument("--replies", type=int, default=64, help="replies per measurement (at least streams)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default="sdk,app", help="sdk (the OpenAI SDK's stream), app (ChatClient)")
    args = parser.parse_args()
    port = free_port()
    server = multiprocessing.Process(target=serve, args=(port, args.chunks), daemon=True)
    server.start()
    time.sleep(1.0)  # the stub binds its port
    model = cpu_model()
    results: dict[str, list[dict[str, float]]] = {}
    for round_no in range(args.rounds):  # A B A B: every variant at every level, each round
        for streams in (int(s) for s in args.streams.split(",")):
            for variant in args.variants.split(","):
                got = asyncio.run(measure(port, streams, max(args.replies, streams), variant))
                results.setdefault(f"{variant} x{streams}", []).append(got)
                print(f"round {round_no + 1} {variant} streams {streams}: {got}", flush=True)
    server.terminate()
    summary = {
        label: {key: spread(r[key] for r in runs).to_dict() for key in ("chunks_per_s", "cpu_us_per_chunk")}
        for label, runs in results.items()
    }
    doc = {
        "cpu": model,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "chunks_per_reply": args.chunks,
        "rounds": results,
        "summary": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
