"""Running the HF transformers baseline (backend.child.hf_baseline) in the engine's interpreter for a benchmark.

The baseline gets the very requests the server got, each with the number of tokens the server produced
for it, so both sides generate the same tokens, in as many rounds as the server had (round by round).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from tqdm import tqdm

from backend.benchmarks.loadgen import LevelRun, Sampling
from backend.benchmarks.stats import RequestResult, combine_rounds, level_metrics
from backend.config import ROOT
from backend.errors import BenchmarkError


def baseline_job(
    args: argparse.Namespace, model: str, sampling: Sampling, done: dict[str, dict[int, list[LevelRun]]]
) -> tuple[dict[str, Any], list[str]]:
    """The job for backend.child.hf_baseline: the server's requests of every round (round by round), each with
    the token count the server produced; and the dataset of each of the job's levels."""
    levels, names = [], []
    repeat = max((len(runs) for by_level in done.values() for runs in by_level.values()), default=0)
    for number in range(repeat):
        for dataset, by_level in done.items():
            for level, runs in by_level.items():
                if number >= len(runs):
                    continue
                run = runs[number]
                reqs = [
                    {
                        "messages": r.messages,
                        "max_tokens": res.output_tokens if res.success and res.output_tokens else r.max_tokens,
                    }
                    for r, res in zip(run.requests, run.results, strict=True)
                ]
                levels.append({"concurrency": level, "requests": reqs})
                names.append(dataset)
    job = {
        "model": str(Path(model).resolve()) if Path(model).exists() else model,
        "dtype": args.hf_dtype,
        "cache": args.hf_cache,
        "threads": args.hf_threads,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "seed": args.seed,
        "levels": levels,
    }
    return job, names


def _job_file(job: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """Write the job to a temporary file; return its path and the baseline's environment."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as fh:
        json.dump(job, fh, ensure_ascii=False)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    if Path(job["model"]).exists():
        env["HF_HUB_OFFLINE"] = "1"
    return fh.name, env


async def run_baseline(python: str, job: dict[str, Any], progress: bool = True) -> dict[str, Any]:
    """Run backend.child.hf_baseline in `python` with a progress bar; return its JSON result."""
    total = sum(len(level["requests"]) for level in job["levels"])
    job_path, env = _job_file(job)
    tail: list[str] = []
    try:
        proc = await asyncio.create_subprocess_exec(
            python,
            "-m",
            "backend.child.hf_baseline",
            job_path,
            cwd=ROOT,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stderr is not None and proc.stdout is not None
        with tqdm(total=total, desc="HF transformers baseline", unit="req", disable=not progress) as bar:
            reading = asyncio.create_task(proc.stdout.read())
            async for raw_line in proc.stderr:
                line = raw_line.decode("utf-8", "replace").rstrip()
                if line.startswith("PROGRESS "):
                    bar.update(int(line.split()[1]) - bar.n)
                elif line:
                    tail = [*tail[-29:], line]
            out = await reading
            code = await proc.wait()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(job_path)
    if code != 0:
        raise BenchmarkError(
            f"The HF transformers baseline failed (exit code {code}):\n" + "\n".join(tail[-15:]),
            "Check --hf-model and --hf-python, or pass --no-baseline.",
        )
    return dict(json.loads(out))


def add_baseline(doc: dict[str, Any], names: list[str], result: dict[str, Any]) -> None:
    """Put the baseline's levels into the run document as target 'hf', each level's rounds combined."""
    rounds: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for order, (dataset, level) in enumerate(zip(names, result["levels"], strict=True), start=1):
        results = [RequestResult(**r) for r in level["results"]]
        metrics = level_metrics(level["concurrency"], results, level["duration_s"])
        by_level = rounds.setdefault(dataset, {}).setdefault(level["concurrency"], [])
        where = {"round": len(by_level) + 1, "order": order}
        by_level.append(where | metrics.to_dict() | {"peak_memory_bytes": level["peak_rss_bytes"]})
    for dataset, of_dataset in rounds.items():
        levels = [combine_rounds(records) | {"memory_source": "peak RSS"} for records in of_dataset.values()]
        doc["runs"].append({"dataset": dataset, "target": "hf", "levels": levels})
    doc["baseline"] = {k: v for k, v in result.items() if k != "levels"}
