"""Engine-alone screening with llama-batched-bench: configurations alternated over rounds, each run recorded with
the share of the cores that other processes took meanwhile (a figure taken beside other work is not a figure).

usage: python screen.py OUT_DIR CONFIGS_JSON ROUNDS   (configs as in configs.json beside this file)"""

import json
import os
import subprocess
import sys

sys.path.insert(0, "/work/main")
from backend.serving.cputime import OtherWork

P = "/work/main/.venv-engine/llama.cpp/bin"
ENV = {**os.environ, "GGML_BACKEND_PATH": f"{P}/cpu/libggml-cpu-zen4.so"}


def run(model: str, t: int, tb: int, npl: list[int], npp: int, ntg: int, extra: tuple[str, ...] = ()) -> list[dict]:
    cmd = [
        "/tmp/lltools/llama-batched-bench", "-m", model, "-c", str(max(npl) * (npp + ntg) + 256), "-b", "2048",
        "-ub", "512", "-npp", str(npp), "-ntg", str(ntg), "-npl", ",".join(map(str, npl)), "-t", str(t),
        "-tb", str(tb), "-fa", "on", "--output-format", "jsonl", *extra,
    ]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, check=True)
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{") and '"pl"' in line]


def main() -> None:
    out, configs, rounds = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    os.makedirs(out, exist_ok=True)
    for r in range(rounds):
        for c in configs:
            before = os.times()
            watch = OtherWork(None)
            watch.start()
            rows = run(**c["args"])
            other_s, wall = watch.seconds()
            after = os.times()
            ours = (after.children_user + after.children_system) - (before.children_user + before.children_system)
            share = max(0.0, other_s - ours) / (wall * 2)
            rec = {"round": r, "name": c["name"], "rows": rows, "wall_s": wall, "other_share": round(share, 3),
                   "load": os.getloadavg()}  # fmt: skip
            speeds = " ".join(f"pl{x['pl']} {x['speed_tg']:.0f}" for x in rows)
            print(c["name"], r, f"other {share:.2f}", speeds, flush=True)
            with open(f"{out}/runs.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")


main()
