"""Reference log-probabilities of a model: HF transformers in float32 on the CPU (run with the engine's interpreter).

usage: python -m backend.child.logprob_reference MODEL OUT.json [--gguf-file NAME] [--new-tokens 16] [--top 20]
       [--threads 1]

For a fixed list of chat prompts it renders the model's own chat template to token ids, greedily generates a
short continuation in float32, and records, for every continuation position, the reference's top log-probabilities
of the distribution that predicts that token. `backend.serving.answers` compares an engine against this file.
Imports only the standard library, torch and transformers (gguf and accelerate for a GGUF), so it runs in the
engine's environment without the app's packages.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

VERSION = 1

# Short on purpose (the reference runs at a model's first start); English and Simplified Chinese, one system
# message. Full-width punctuation is kept: an engine whose tokenizer normalises it differently from the model's
# gives other token ids to every Chinese user, and the template check is there to say so.
PROMPTS: list[dict[str, Any]] = [
    {"name": "en-capital", "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"name": "en-haiku", "messages": [{"role": "user", "content": "Write a haiku about the sea."}]},
    {"name": "zh-beijing", "messages": [{"role": "user", "content": "请用一句话介绍一下北京。"}]},
    {"name": "zh-weather", "messages": [{"role": "user", "content": "你好 今天天气怎么样"}]},
    {
        "name": "en-system",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
            {"role": "user", "content": "Name three primary colors."},
        ],
    },
]


def _ids(rendered: Any) -> list[int]:
    """Token ids from apply_chat_template's result: a list, or (transformers 5) a BatchEncoding / dict."""
    if hasattr(rendered, "keys") and "input_ids" in rendered:
        rendered = rendered["input_ids"]
    if hasattr(rendered, "tolist"):
        rendered = rendered.tolist()
    if rendered and isinstance(rendered[0], list):  # a batch of one
        rendered = rendered[0]
    return [int(t) for t in rendered]


def compute(model_dir: Path, gguf_file: str | None, new_tokens: int, top: int, threads: int = 1) -> dict[str, Any]:
    """Run the reference model over PROMPTS and return the JSON-ready result."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    torch.manual_seed(0)
    # One thread by default: it runs beside a starting engine (or a compiler) on 2 cores, and OpenMP threads
    # that share a busy core were 10x slower here (2.4 s vs 0.21 s per forward pass of the demo model).
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    extra: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), **extra)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, **extra)
    model.eval()
    eos = model.generation_config.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos if isinstance(eos, int) else 0)
    prompts = []
    for spec in PROMPTS:
        rendered = tokenizer.apply_chat_template(spec["messages"], add_generation_prompt=True, tokenize=True)
        prompt_ids = _ids(rendered)
        with torch.inference_mode():
            inputs = torch.tensor([prompt_ids])
            out = model.generate(
                inputs,
                attention_mask=torch.ones_like(inputs),
                do_sample=False,
                max_new_tokens=new_tokens,
                pad_token_id=pad,
                temperature=None,
                top_p=None,
                top_k=None,
            )
            continuation = [int(t) for t in out[0, len(prompt_ids) :].tolist()]
            # One teacher-forced pass over the whole sequence: the logits at i predict token i + 1.
            full = torch.tensor([prompt_ids + continuation])
            logits = model(full).logits[0].float()
            logprobs = torch.log_softmax(logits[len(prompt_ids) - 1 : len(prompt_ids) + len(continuation) - 1], -1)
        positions = []
        for p, token in enumerate(continuation):
            values, ids = torch.topk(logprobs[p], min(top, logprobs.shape[-1]))
            positions.append(
                {
                    "top": [[int(i), float(v)] for i, v in zip(ids.tolist(), values.tolist(), strict=True)],
                    "chosen_logprob": float(logprobs[p, token]),
                }
            )
        prompts.append(
            {
                "name": spec["name"],
                "messages": spec["messages"],
                "prompt_ids": prompt_ids,
                "continuation_ids": continuation,
                "positions": positions,
            }
        )
    name = f"{model_dir}/{gguf_file}" if gguf_file else str(model_dir)
    return {
        "version": VERSION,
        "model": name,
        "dtype": "float32",
        "top": top,
        "prompts": prompts,
        "seconds": round(time.monotonic() - started, 3),
    }


def main(argv: list[str] | None = None) -> int:
    """Command line: compute the reference and write it as JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m backend.child.logprob_reference", description=__doc__.splitlines()[0]
    )
    parser.add_argument("model", type=Path, help="a Hugging Face model folder, or the folder holding --gguf-file")
    parser.add_argument("out", type=Path, help="where to write the JSON")
    parser.add_argument("--gguf-file", default=None, help="a GGUF file name inside MODEL (read by transformers)")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a busy 2-core machine)")
    args = parser.parse_args(argv)
    result = compute(args.model, args.gguf_file, args.new_tokens, args.top, args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(result, ensure_ascii=False))
    tmp.replace(args.out)
    n = sum(len(p["positions"]) for p in result["prompts"])
    print(
        f"reference for {result['model']}: {len(result['prompts'])} prompts, {n} positions, {result['seconds']:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
