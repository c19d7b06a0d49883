"""The first text of questions about a document: the second question about the same document against the first (the
engine's cache of the conversation, passages included), and questions with their passages against the same questions
without documents.

    /work/tools/heavy .venv/bin/python results/documents/first_text.py [--rounds 3] [--pairs 8] \
        --out results/documents/first-text-cpu

Each round starts the engine as the app does (ChatService.from_config: the configured engine and model with the
environment's ERNIE_* settings; on a machine without the model the offline demo model, on llama.cpp unless
ERNIE_ENGINE__NAME says otherwise) and fills a library (an SQLite file) with the six documents of
tests/documents_corpus, as one user's. Then, for each of `--pairs` pairs of questions about the same document
(questions.jsonl), two chats of two turns, in alternating order:
- with documents: the first question (its passages sent with it, backend.chat.sources), then the second in the same
  chat (the first's passages stay in the history as the model saw them; the second's own come with it);
- without: the same two questions in a chat without a library.
Timed through the chat's own path (ChatService.reply): the message to its first text. From the engine's own metrics,
the prompt tokens it evaluated for each request (what it did not take from its cache) beside the prompt's size.

Writes results.json and report.md under --out. Other processes on the machine distort the times: the report gives
the load average before and after each round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from backend.benchmarks.stats import spread_text  # noqa: E402
from backend.chat.service import ChatService  # noqa: E402
from backend.chat.turn import Done, Text  # noqa: E402
from backend.config import load_config  # noqa: E402
from backend.documents.library import Library  # noqa: E402
from backend.ops.prometheus_text import sample_totals  # noqa: E402
from backend.serving.hardware import cpu_model  # noqa: E402

CORPUS = ROOT / "tests" / "documents_corpus"
QUESTIONS = Path(__file__).with_name("questions.jsonl")
OWNER = "user:measure"
# The prompt tokens an engine evaluated (not taken from its cache): llama.cpp counts only those; vLLM counts every
# prompt token and, apart, those its prefix cache gave.
EVALUATED = {"llama.cpp": ("llamacpp:prompt_tokens_total", None), "vllm": ("vllm:prompt_tokens_total",
             "vllm:prefix_cache_hits_total")}  # fmt: skip


def pairs(count: int) -> list[tuple[str, str]]:
    """`count` pairs of questions about the same document, taken in turn from each document of the set."""
    by_document: dict[str, list[str]] = defaultdict(list)
    for line in QUESTIONS.read_text(encoding="utf-8").splitlines():
        if line.strip():
            asked = json.loads(line)
            by_document[asked["document"]].append(asked["question"])
    found: list[tuple[str, str]] = []
    for index in range(0, max(map(len, by_document.values())) - 1, 2):
        found += [(questions[index], questions[index + 1]) for questions in by_document.values()
                  if index + 1 < len(questions)]  # fmt: skip
    if len(found) < count:
        raise SystemExit(f"the question set has {len(found)} pairs, not {count}")
    return found[:count]


async def evaluated(service: ChatService) -> float | None:
    """The prompt tokens the engine has evaluated so far (its metrics), or None where it does not say."""
    engine = service.supervisor.spec.engine if service.supervisor.spec else ""
    counted, cached = EVALUATED["llama.cpp" if engine == "llama.cpp" else "vllm"]
    async with httpx.AsyncClient(timeout=10, trust_env=False) as http:
        response = await http.get(service.endpoint.base_url + "/metrics", headers=service.endpoint.headers)
    if response.status_code != 200:
        return None
    totals = sample_totals(response.text)
    if counted not in totals:
        return None
    return totals[counted] - (totals.get(cached, 0.0) if cached else 0.0)


async def turn(service: ChatService, session: Any, question: str) -> dict[str, Any]:
    """One message of a chat: the first text's time, the prompt's size, what the engine evaluated, the passages."""
    before = await evaluated(service)
    sent, first, done = time.perf_counter(), None, None
    async for event in service.reply(session, question):
        if isinstance(event, Text) and first is None:
            first = time.perf_counter()
        if isinstance(event, Done):
            done = event
    if done is None or done.ending != "finished" or first is None:
        raise SystemExit(f"{question!r} ended {done.ending if done else 'without an end'}: {done and done.error}")
    await asyncio.sleep(0.2)  # the engine's counters trail the reply's end by a moment
    after = await evaluated(service)
    prompt = (done.stats.prompt_tokens if done.stats else None) or done.prompt_tokens
    return {
        "first_text_ms": round((first - sent) * 1000, 2), "prompt_tokens": prompt,
        "evaluated_tokens": None if before is None or after is None else round(after - before),
        "passages": len(done.sources),
    }  # fmt: skip


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def one_round(number: int, questions: list[tuple[str, str]], work: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k.startswith("ERNIE_")}
    env.update({"ERNIE_SERVER__PORT": "0", "ERNIE_PATHS__DATA_DIR": str(work), "ERNIE_CHAT__MAX_TOKENS": "32"})
    env.setdefault("ERNIE_ENGINE__NAME", "llama.cpp")
    env.setdefault("ERNIE_DEMO__MAX_TOKENS", "32")  # the demo model's replies (its own settings)
    env.setdefault("ERNIE_TUNE__ENABLED", "false")  # the engine is named: no tune at each start
    env.setdefault("ERNIE_PATHS__CACHE_DIR", str(work / "cache"))  # the app's own caches (canary, tune) untouched
    cfg = load_config(environ=env)
    service = ChatService.from_config(cfg)
    library = await Library.open(cfg)
    for path in sorted(CORPUS.iterdir()):
        await library.add(OWNER, path.name, path.read_bytes())
    service.finder = library
    service.start()
    try:
        if not await service.supervisor.wait_ready(1800):
            raise SystemExit(f"engine not ready: {service.supervisor.status}")
        load_before = load()
        chats = []
        for index, (first, second) in enumerate(questions):
            order = ["documents", "none"] if (index + number) % 2 == 0 else ["none", "documents"]
            for kind in order:
                session = service.new_session()
                session.owner = OWNER if kind == "documents" else None
                turns = [await turn(service, session, first), await turn(service, session, second)]
                chats.append({"kind": kind, "questions": [first, second], "turns": turns})
        engine = service.supervisor.spec.engine if service.supervisor.spec else None
        return {"round": number, "engine": engine, "model": service.endpoint.model, "load_before": load_before,
                "load_after": load(), "chats": chats}  # fmt: skip
    finally:
        await service.stop()
        await library.close()


def report(rounds: list[dict[str, Any]]) -> str:
    """Medians over every chat of every round (min-max) of each turn's first text and tokens."""
    rows = []
    for kind, label in (("documents", "with documents"), ("none", "without documents")):
        for position, which in ((0, "first question"), (1, "second question, same chat")):
            turns = [c["turns"][position] for r in rounds for c in r["chats"] if c["kind"] == kind]
            evaluated_tokens = [t["evaluated_tokens"] for t in turns if t["evaluated_tokens"] is not None]
            rows.append(
                f"| {label} | {which} | {spread_text([t['first_text_ms'] for t in turns], 0)} | "
                f"{spread_text([t['prompt_tokens'] for t in turns], 0)} | "
                f"{spread_text(evaluated_tokens, 0, missing='–')} | "
                f"{statistics.median(t['passages'] for t in turns):.0f} |"
            )
    ratios = [c["turns"][1]["first_text_ms"] / c["turns"][0]["first_text_ms"]
              for r in rounds for c in r["chats"] if c["kind"] == "documents"]  # fmt: skip
    first = rounds[0]
    lines = [
        f"Engine {first['engine']}, model {first['model']}; CPU {cpu_model()}, {os.cpu_count()} cores; "
        f"{len(rounds)} rounds of {len(first['chats']) // 2} pairs of questions.",
        "",
        "| chat | message | first text ms | prompt tokens | tokens the engine evaluated | passages |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"Second question against the first about the same document (with documents), per chat: "
        f"{spread_text(ratios, 2)} of its first text.",
        "",
        "Load average (1, 5, 15 min) before and after each round: "
        + "; ".join(f"{r['load_before']} → {r['load_after']}" for r in rounds)
        + ". Other processes may have run beside it: these figures are for a quiet machine to confirm.",
    ]
    return "\n".join(lines) + "\n"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="engine starts (default 3)")
    parser.add_argument("--pairs", type=int, default=8, help="pairs of questions per round (default 8)")
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json and report.md")
    args = parser.parse_args()
    questions = pairs(args.pairs)
    rounds = []
    for number in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="documents-first-text-") as work:
            rounds.append(await one_round(number, questions, Path(work)))
            print(f"round {number + 1} of {args.rounds} done", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rounds, ensure_ascii=False, indent=1) + "\n")
    (args.out / "report.md").write_text(report(rounds))
    print(report(rounds))


if __name__ == "__main__":
    asyncio.run(main())
