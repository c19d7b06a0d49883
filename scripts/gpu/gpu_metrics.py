"""What the GPU scripts read off the machine and the engine, without the app's chat service: the GPU's memory and
processes, an engine's process tree and CPU use, vLLM's per-phase histograms (/metrics), the lines of an engine log
that say what it ran with. Imported by scripts/gpu/gpu_tune.py, gpu_price.py, gpu_start.py and the others.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
)
COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions", "vllm:prompt_tokens")
LOG_LINES = re.compile(
    r"non-default args|Initializing a V1 LLM engine|Asynchronous scheduling|Chunked prefill|Using max model len|"
    r"attention backend|AttentionBackendEnum|cudagraph|CUDAGraphMode|Capturing CUDA graphs \(\w+\): +0%|"
    r"Graph capturing finished|torch.compile took|Using cache directory|Available KV cache|GPU KV cache size|"
    r"Maximum concurrency|init engine|Model loading took|Starting vLLM server|ERROR|Traceback|Error:",
    re.IGNORECASE,
)


def sh(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"({cmd[0]}: {exc})"


def gpu_state() -> dict[str, Any]:
    """What is on the GPU now: its memory in use and its compute processes (nvidia-smi)."""
    used = sh("nvidia-smi", "--query-gpu=memory.used,utilization.gpu,clocks.sm", "--format=csv,noheader")
    apps = sh("nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader")
    return {"memory_used_util_sm_clock": used, "compute_apps": [a for a in apps.splitlines() if a.strip()]}


def gpu_used_mib() -> int | None:
    out = sh("nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits").splitlines()
    try:
        return int(out[0].strip())
    except (IndexError, ValueError):
        return None


async def wait_gpu_free(limit_s: float = 60, below_mib: int = 2048) -> float:
    """Wait until the GPU's memory in use is below `below_mib` (the last engine is gone); the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        used = gpu_used_mib()
        if used is None or used < below_mib:
            break
        await asyncio.sleep(1)
    return round(time.monotonic() - t0, 1)


def process_tree(root: int) -> dict[int, str]:
    """The engine's processes: `root` (vLLM's API server) and its descendants (the engine core), by pid: name."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        pid, rest = int(text.split(" ", 1)[0]), text[text.rindex(")") + 2 :].split()
        parents[pid], names[pid] = int(rest[1]), text[text.index("(") + 1 : text.rindex(")")]
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in names:
            tree[pid] = names[pid]
            todo += [child for child, parent in parents.items() if parent == pid]
    return tree


def cpu_seconds(pids: dict[int, str]) -> dict[int, float]:
    """Each process's CPU time so far (user + system, its threads together), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        out[pid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def cpu_shares(pids: dict[int, str], before: dict[int, float], wall_s: float) -> dict[str, float]:
    """Each engine process's CPU use over a level, as a share of one core ("name pid": share)."""
    after = cpu_seconds(pids)
    return {f"{pids[p]} {p}": round((after[p] - before[p]) / wall_s, 3) for p in after if p in before}


def machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    info: dict[str, Any] = {
        "gpu": sh("nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"),
        "cuda_driver": sh("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_model": next((ln.split(":", 1)[1].strip() for ln in cpuinfo if "model name" in ln), "?"),
    }
    try:  # the engine's interpreter is this one on the GPU machine
        import torch
        import vllm

        info |= {"vllm": vllm.__version__, "torch": torch.__version__, "torch_cuda": torch.version.cuda}
    except ImportError as exc:
        info["vllm"] = f"not importable here: {exc}"
    return info


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {"name{le=...}" or "name_sum"/"name_count": value}, summed over other labels."""
    out: dict[str, float] = {}
    wanted = HISTOGRAMS + COUNTERS
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        m = re.match(r"([^{\s]+)(\{[^}]*\})?\s+(\S+)", line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        base = re.sub(r"(_bucket|_sum|_count|_total|_created)$", "", name)
        if base not in wanted or name.endswith("_created"):
            continue
        le = re.search(r'le="([^"]+)"', labels)
        key = f"{base}{{le={le.group(1)}}}" if le else re.sub(r"_total$", "", name)
        try:
            out[key] = out.get(key, 0.0) + float(value)
        except ValueError:
            continue
    return out


def metrics_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Per histogram: count, sum (s), mean (ms), cumulative buckets over the level; counters' change."""
    out: dict[str, Any] = {}
    for h in HISTOGRAMS:
        count = after.get(f"{h}_count", 0.0) - before.get(f"{h}_count", 0.0)
        total = after.get(f"{h}_sum", 0.0) - before.get(f"{h}_sum", 0.0)
        buckets = {
            k[len(h) + 4 : -1]: after[k] - before.get(k, 0.0) for k in after if k.startswith(h + "{le=")
        }  # fmt: skip
        if count > 0:
            out[h.removeprefix("vllm:")] = {
                "count": count,
                "sum_s": round(total, 6),
                "mean_ms": round(1000 * total / count, 3),
                "buckets": buckets,
            }
    for c in COUNTERS:
        if c in after:
            out[c.removeprefix("vllm:")] = after[c] - before.get(c, 0.0)
    return out


async def scrape(http: httpx.AsyncClient, root: str) -> dict[str, float]:
    try:
        resp = await http.get(root + "/metrics")
        return parse_metrics(resp.text) if resp.status_code == 200 else {}
    except httpx.HTTPError:
        return {}


def log_excerpt(path: Path) -> list[str]:
    """The log lines that say what the engine ran with (up to the server's start), and a few errors after."""
    if not path.exists():
        return []
    kept, errors, serving = [], 0, False
    for line in path.read_text(errors="replace").splitlines():
        if not LOG_LINES.search(line):
            continue
        if serving:
            errors += 1
            if errors > 6:
                break
        kept.append(line[:6000])
        serving = serving or "Starting vLLM server" in line
    return kept


def out_and_model(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The arguments of a measurement that starts the engine itself: its results folder and the model folder."""
    parser.add_argument("out", type=Path, help="the results folder")
    parser.add_argument("model", help="the model folder whose architecture is measured")
    return parser.parse_args()
