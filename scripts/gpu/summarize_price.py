"""The tables of results/gpu-*/issue43-price/README.md from a price.json of scripts/gpu/gpu_price.py.

usage: python scripts/gpu/summarize_price.py PRICE_JSON   (median (min-max) over the rounds; Markdown to stdout)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from backend.benchmarks.stats import spread_text

WAYS = {
    "chat": "vLLM alone: /v1/chat/completions",
    "ids": "vLLM alone: /v1/completions with the prompt's ids",
    "app": "the app's ChatClient, messages",
    "app-ids": "the app's ChatClient, its own token ids",
}


def vllm_ms(level: dict[str, Any], phase: str) -> float:
    return float(level["phases"][phase]["mean_ms"])


def engines(doc: dict[str, Any]) -> None:
    """Each engine's levels: per round and median (min-max); its answer check and memory (FP8 priced)."""
    rounds = doc["rounds"]
    names = [n for n in doc.get("order", []) if any(n in r for r in rounds)]
    print("### Each engine alone (vLLM's chat API), 512-token prompts, 256 output tokens, greedy, ignore_eos\n")
    print("| engine | users | output tok/s | per round | TTFT P50 ms | TTFT P99 ms | TPOT P50 ms | per round TPOT "
          "| errors |\n|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    for name in names:
        for users in ("1", "16", "64"):
            ls = [r[name][users] for r in rounds if users in r.get(name, {})]
            if not ls:
                continue
            tok = [x["output_tokens_per_s"] for x in ls]
            tpot = [x["tpot_ms"]["p50"] for x in ls]
            cells = [
                spread_text(tok),
                " / ".join(f"{v:.0f}" for v in tok),
                spread_text([x["ttft_ms"]["p50"] for x in ls]),
                spread_text([x["ttft_ms"]["p99"] for x in ls]),
                spread_text(tpot),
                " / ".join(f"{v:.2f}" for v in tpot),
                str(sum(x["errors"] for x in ls)),
            ]
            print(f"| {name} | {users} | " + " | ".join(cells) + " |")
    print("\n### Answer check against the float32 reference, and memory\n")
    print("| engine | limits | verdict | positions | median / p95 / max abs diff nats | top-1 agreement "
          "| top-list overlap mean (min) | with bfloat16's limits | GPU MiB | weights, KV tokens |"
          "\n|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    for name in names:
        e = doc["engines"][name]
        c = e.get("check") or {}
        st = c.get("stats") or {}
        strict = e.get("check_bf16_limits")
        mem = doc.get("memory", {}).get(name, {})
        logs = mem.get("log", [])
        weights = next((ln.split("took ")[1].split(" and")[0] for ln in logs if "Model loading took" in ln), "?")
        kv = next((ln.split("size: ")[1] for ln in logs if "KV cache size" in ln), "?")
        cells = [
            c.get("limits", "bfloat16"),
            {True: "pass", False: "FAIL"}.get(c.get("passed"), "not run"),
            str(st.get("positions", "")),
            f"{st.get('median', 0):.4f} / {st.get('p95', 0):.4f} / {st.get('max', 0):.4f}" if st else "",
            f"{st.get('top1_agree')}/{st.get('positions')}" if st else "",
            f"{st.get('topk_overlap_mean', 0):.3f} ({st.get('topk_overlap_min', 0):.2f})" if st else "",
            "" if strict is None else ("pass" if strict.get("passed") else "FAIL"),
            str(mem.get("gpu_mib", "")),
            f"{weights}, {kv}",
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()


def main(path: str) -> None:
    doc = json.load(open(path))
    rounds = doc["rounds"]
    if any(n != "bf16" for n in doc.get("order", [])):
        engines(doc)
    print("### bf16 engine alone (vLLM's chat API), 512-token prompts, 256 output tokens, greedy\n")
    print("| users | output tok/s | client TTFT P50 ms | client TTFT P99 ms | vLLM's own TTFT mean ms "
          "| of it prefill mean ms | TPOT P50 ms |\n|---|---|---|---|---|---|---|")  # fmt: skip
    for users in ("1", "16", "64"):
        ls = [r["bf16"][users] for r in rounds if users in r.get("bf16", {})]
        if not ls:
            continue
        cells = [
            spread_text([x["output_tokens_per_s"] for x in ls]),
            spread_text([x["ttft_ms"]["p50"] for x in ls]),
            spread_text([x["ttft_ms"]["p99"] for x in ls]),
            spread_text([vllm_ms(x, "time_to_first_token_seconds") for x in ls]),
            spread_text([vllm_ms(x, "request_prefill_time_seconds") for x in ls]),
            spread_text([x["tpot_ms"]["p50"] for x in ls]),
        ]
        print(f"| {users} | " + " | ".join(cells) + " |")
    print("\n### The first token at 16 users, the same 64 prompts four ways, alternated (order reversed each round)\n")
    print("| way | P50 ms | P99 ms | mean ms | vLLM's own TTFT mean ms | client minus vLLM's (mean) ms "
          "| per round P99 |\n|---|---|---|---|---|---|---|")  # fmt: skip
    for way, label in WAYS.items():
        ls = [r["ways16"][way] for r in rounds if "ways16" in r]
        if not ls:
            continue
        own = [vllm_ms(x, "time_to_first_token_seconds") for x in ls]
        mean = [x["ttft_ms"]["mean"] for x in ls]
        cells = [
            spread_text([x["ttft_ms"]["p50"] for x in ls]),
            spread_text([x["ttft_ms"]["p99"] for x in ls]),
            spread_text(mean),
            spread_text(own),
            spread_text([a - b for a, b in zip(mean, own, strict=True)]),
            " / ".join(f"{x['ttft_ms']['p99']:.1f}" for x in ls),
        ]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("\n### Long chats: one user, 6 measured messages per way and round, the history in vLLM's prefix cache\n")
    print("| chat | way | client TTFT mean ms | vLLM's own TTFT mean ms | client minus vLLM's ms "
          "| per round client mean | prefix-cache hit share |\n|---|---|---|---|---|---|---|")  # fmt: skip
    sizes = sorted({k.split("-", 1)[0] for r in rounds for k in r.get("long", {})}, key=int)
    for size in sizes:
        for way, label in WAYS.items():
            ls = [r["long"][f"{size}-{way}"] for r in rounds if f"{size}-{way}" in r.get("long", {})]
            own = [vllm_ms(x, "time_to_first_token_seconds") for x in ls]
            mean = [x["ttft_ms"]["mean"] for x in ls]
            hits = sum(x["phases"]["prefix_cache_hits"] for x in ls) / sum(
                x["phases"]["prefix_cache_queries"] for x in ls
            )
            cells = [
                spread_text(mean),
                spread_text(own),
                spread_text([a - b for a, b in zip(mean, own, strict=True)]),
                " / ".join(f"{m:.1f}" for m in mean),
                f"{hits:.3f}",
            ]
            print(f"| {ls[-1].get('prompt_tokens')} tokens | {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("price_json", help="price.json of gpu_price.py")
    main(parser.parse_args().price_json)
