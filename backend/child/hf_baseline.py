"""The baseline people compare with: plain Hugging Face transformers `generate`, batch = concurrency.

Run with the engine's interpreter (it has torch and transformers): `python -m backend.child.hf_baseline JOB.json`.
The job names the model folder and, per level, the requests (chat messages and the number of tokens
to generate); the result, printed as JSON on stdout, holds per-request timings in the shape of
backend.benchmarks.stats.RequestResult. A batch of `concurrency` requests starts together and each request is
timed from the batch start: TTFT is the prefill, ITL the time of each decode step (measured by a
logits processor, called once per step), E2EL the step that produced its last token. A folder with a
config but no weights (the architecture only) gets random weights, as vLLM's --load-format dummy does.
Progress goes to stderr as `PROGRESS <requests done>` lines. Only stdlib is imported at the top.
"""

from __future__ import annotations

import itertools
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")


def _load(model_dir: str, dtype_name: str) -> tuple[Any, Any, str]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, dtype_name)
    folder = Path(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if any(any(folder.glob(p)) for p in WEIGHT_PATTERNS):
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
        weights = "loaded"
    else:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=dtype)
        weights = "random"
    # The GPU when there is one: the baseline people compare with runs where the engine runs.
    model.to("cuda" if torch.cuda.is_available() else "cpu")
    model.eval()
    return model, tokenizer, weights


def _generate_batch(model: Any, tokenizer: Any, requests: list[dict[str, Any]], job: dict[str, Any]) -> list[dict]:
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    steps: list[float] = []

    class StepTimer(LogitsProcessor):
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            steps.append(time.perf_counter())
            return scores

    lengths = [int(r["max_tokens"]) for r in requests]
    most = max(lengths)
    start = time.perf_counter()
    enc = tokenizer.apply_chat_template(
        [r["messages"] for r in requests],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        padding=True,
    )
    enc = enc.to(model.device)
    prompt_tokens = enc["attention_mask"].sum(dim=1).tolist()
    sampling: dict[str, Any] = {"do_sample": False}
    if job.get("temperature", 0) > 0:
        sampling = {"do_sample": True, "temperature": job["temperature"], "top_p": job.get("top_p", 1.0)}
    options: dict[str, Any] = {}
    if job.get("cache") == "static":
        options["cache_implementation"] = "static"
    with torch.inference_mode():
        model.generate(
            **enc,
            max_new_tokens=most,
            min_new_tokens=most,  # as ignore_eos: every request gets exactly its share of steps
            logits_processor=LogitsProcessorList([StepTimer()]),
            pad_token_id=tokenizer.pad_token_id,
            **sampling,
            **options,
        )
    results = []
    for count, prompt in zip(lengths, prompt_tokens, strict=True):
        times = [t - start for t in steps[:count]]
        results.append(
            {
                "success": len(times) == count,
                "ttft": times[0],
                "first_text": times[0],
                "latency": times[-1],
                "itl": [b - a for a, b in itertools.pairwise(times)],
                "output_tokens": len(times),
                "prompt_tokens": int(prompt),
                "error": "" if len(times) == count else f"only {len(times)} of {count} steps ran",
            }
        )
    return results


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Load the model once, then run every level of the job batch by batch; return the timings."""
    import torch

    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    torch.manual_seed(int(job.get("seed", 0)))
    started = time.perf_counter()
    model, tokenizer, weights = _load(job["model"], job.get("dtype", "bfloat16"))
    load_s = time.perf_counter() - started
    warm = [{"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}]
    _generate_batch(model, tokenizer, warm, job)
    done = 0
    levels = []
    for level in job["levels"]:
        size = int(level["concurrency"])
        requests = level["requests"]
        results: list[dict[str, Any]] = []
        level_start = time.perf_counter()
        for first in range(0, len(requests), size):
            batch = requests[first : first + size]
            try:
                results += _generate_batch(model, tokenizer, batch, job)
            except Exception as exc:  # one failed batch is reported, the others still run
                results += [{"success": False, "error": f"{type(exc).__name__}: {exc}"[:300]} for _ in batch]
            done += len(batch)
            print(f"PROGRESS {done}", file=sys.stderr, flush=True)
        levels.append(
            {
                "concurrency": size,
                "duration_s": time.perf_counter() - level_start,
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "results": results,
            }
        )
    return {
        "model": job["model"],
        "weights": weights,
        "dtype": job.get("dtype", "bfloat16"),
        "cache": job.get("cache", "static"),
        "torch_threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch_version": torch.__version__,
        "load_s": load_s,
        "levels": levels,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m backend.child.hf_baseline JOB.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    print(json.dumps(run(job)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
