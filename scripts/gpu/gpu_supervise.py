"""The app's supervisor on a GPU machine: readiness, a dead GPU process, and a stop that leaves the GPUs empty.

usage: python scripts/gpu/gpu_supervise.py OUT_DIR MODEL_DIR CONFIG [CONFIG ...]
   e.g. python scripts/gpu/gpu_supervise.py $OUT /tmp/gpub/gpubundle/ernie03b h200        (one GPU)
        python scripts/gpu/gpu_supervise.py $OUT /tmp/gpub/gpubundle/ernie03b tp2 dp2     (nvidia-h200-x2, issue 18)

For each CONFIG (the names of scripts/gpu/gpu_tune.py: a profile of config/backend.yaml plus vLLM flags) the engine
is started as the app starts it (ChatService.from_config, the project's supervisor), and then:
  1. ready: the supervisor says READY, a streamed reply of 16 tokens (ignore_eos) ends by length with 16 tokens;
  2. one GPU process killed: of the engine's processes that nvidia-smi lists on a GPU, a vLLM worker (else its
     engine core; data parallel: one rank's) gets SIGKILL. The supervisor must see the engine's failure,
     restart the whole engine, leave none of the old processes alive and none of them on a GPU, and serve
     the same 16-token reply again;
  3. stop: after ChatService.stop() none of the engine's processes is alive and nvidia-smi lists none of them.
Each check is recorded as {"ok": bool, ...evidence} in OUT_DIR/supervise.jsonl, one line per configuration, and
printed; the exit status is 1 when any check failed. Nothing here is timed for speed: the waits are generous
(300 s) and end as soon as their condition holds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_tune import CONFIGS, gpu_state, machine, service, sh, wait_gpu_free

from backend.benchmarks.memory import alive, process_tree
from backend.chat.service import ChatService
from backend.serving.supervisor import State, Status

WAIT_S = 300.0
REPLY_TOKENS = 16


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "(gone)"


HAS_GPU = shutil.which("nvidia-smi") is not None  # TUNE_SMOKE=1 on a CPU: the engine's processes stand in


def gpu_pids() -> set[int]:
    """The processes nvidia-smi lists as using a GPU now."""
    if not HAS_GPU:
        return set()
    out = sh("nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader,nounits")
    return {int(line) for line in out.split() if line.strip().isdigit()}


async def until(condition: Any, timeout_s: float = WAIT_S) -> tuple[bool, float]:
    """Wait until `condition()` holds; whether it did, and after how many seconds."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if condition():
            return True, round(time.monotonic() - t0, 1)
        await asyncio.sleep(0.2)
    return bool(condition()), round(time.monotonic() - t0, 1)


async def short_reply(svc: ChatService) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Say something."}]
    try:
        async with svc.client.stream(messages, max_tokens=REPLY_TOKENS, ignore_eos=True, temperature=0) as s:
            pieces = [p async for p in s]
    except Exception as exc:  # recorded as a failed check, with what went wrong
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    st = s.stats
    ok = st.completion_tokens == REPLY_TOKENS and st.finish_reason == "length" and bool(pieces)
    return {"ok": ok, "completion_tokens": st.completion_tokens, "finish_reason": st.finish_reason}


def pick_victim(processes: dict[int, str], on_gpu: list[int], api_server: int | None) -> int:
    """The process to kill: a vLLM worker on a GPU if there is one, else its engine core (vLLM names them
    "VLLM::Worker..." and "VLLM::EngineCore..."; the API server's other children, such as multiprocessing's
    resource tracker, are not the engine), else any other process of the engine on a GPU."""
    named = [p for p in on_gpu if p != api_server and processes.get(p, "").startswith("VLLM::")]
    workers = [p for p in named if "Worker" in processes[p]]
    others = [p for p in on_gpu if p != api_server]
    return (workers or named or others or on_gpu)[0]


def tree(pid: int | None) -> dict[int, str]:
    return {p: cmdline(p) for p in process_tree(pid)} if pid else {}


async def check(model: str, name: str, index: int) -> dict[str, Any]:
    rec: dict[str, Any] = {"config": name, "profile": CONFIGS[name][0], "gpu_wait_s": await wait_gpu_free()}
    svc = service(model, name, "supervise", index, max_attempts=3)  # a restart is the point here
    sup = svc.supervisor
    seen: list[str] = []

    def changed(st: Status) -> None:
        problem = getattr(st.problem, "code", None)
        reason = getattr(getattr(st.problem, "params", {}).get("reason"), "code", None)
        seen.append(f"{st.state.value}" + (f" {problem}" if problem else "") + (f" ({reason})" if reason else ""))

    sup.on_change(changed)
    t0 = time.monotonic()
    svc.start()
    try:
        ready = await sup.wait_ready(WAIT_S)
        rec["argv"] = list(sup.spec.argv) if sup.spec else []
        first = tree(sup.status.pid)
        on_gpu = sorted(gpu_pids() & set(first)) if HAS_GPU else sorted(first)
        rec["ready"] = {"ok": ready, "start_s": round(time.monotonic() - t0, 1), "processes": first}
        rec["ready"] |= {"on_gpu": on_gpu, "gpu": gpu_state(), "reply": await short_reply(svc) if ready else None}
        rec["ready"]["ok"] = ready and bool(on_gpu) and rec["ready"]["reply"]["ok"]
        if not ready:
            rec["error"] = f"{sup.status.error}\n{sup.status.log_tail}"
            return rec

        victim = pick_victim(first, on_gpu, sup.status.pid)
        restarts, old_pid = sup.status.restarts, sup.status.pid
        kill = {"victim": victim, "victim_cmdline": first.get(victim), "api_server": old_pid}
        os.kill(victim, signal.SIGKILL)
        noticed, kill["noticed_after_s"] = await until(lambda: sup.status.restarts == restarts + 1)
        back = noticed and await sup.wait_ready(WAIT_S)
        kill["back_after_s"] = round(time.monotonic() - t0 - rec["ready"]["start_s"], 1)
        kill["old_alive"] = [p for p in first if alive(p)]
        kill["old_on_gpu"] = sorted(gpu_pids() & set(first))
        second = tree(sup.status.pid)
        kill |= {"processes": second, "states": list(seen)}
        kill["on_gpu"] = sorted(gpu_pids() & set(second)) if HAS_GPU else sorted(second)
        kill["reply"] = await short_reply(svc) if back else None
        kill["ok"] = bool(
            back
            and sup.status.pid not in (None, old_pid)
            and not kill["old_alive"]
            and not kill["old_on_gpu"]
            and kill["on_gpu"]
            and kill["reply"]["ok"]
        )
        rec["kill"] = kill
    finally:
        last = tree(sup.status.pid)
        t2 = time.monotonic()
        await svc.stop()
        stop: dict[str, Any] = {"stop_s": round(time.monotonic() - t2, 1)}
        gone, stop["gone_after_s"] = await until(lambda: not any(alive(p) for p in last), 30)
        free, stop["gpu_free_after_s"] = await until(lambda: not (gpu_pids() & set(last)), 30)
        stop |= {"alive": [p for p in last if alive(p)], "on_gpu": sorted(gpu_pids() & set(last))}
        stop |= {"gpu": gpu_state(), "state": sup.status.state.value, "ok": gone and free}
        stop["ok"] = stop["ok"] and sup.status.state == State.STOPPED
        rec["stop"] = stop
        rec["states"] = seen
    return rec


async def main(out: Path, model: str, names: list[str]) -> int:
    failed = 0
    for index, name in enumerate(names):
        rec = await check(model, name, index)
        rec["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
        with (out / "supervise.jsonl").open("a") as f:
            f.write(json.dumps(rec) + "\n")
        for step in ("ready", "kill", "stop"):
            got = rec.get(step) or {"ok": False}
            failed += not got["ok"]
            brief = {k: v for k, v in got.items() if k not in ("processes", "gpu", "states", "victim_cmdline")}
            print(f"[supervise] {name} {step}: {'PASS' if got['ok'] else 'FAIL'} {json.dumps(brief)}", flush=True)
        print(f"[supervise] {name} states: {rec.get('states')}", flush=True)
        if "error" in rec:
            print(f"[supervise] {name} FAILED to start: {rec['error'][:3000]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the results folder (created)")
    parser.add_argument("model", help="the model folder (random weights are loaded: --load-format dummy)")
    parser.add_argument("configs", nargs="+", choices=sorted(CONFIGS), metavar="CONFIG", help="names of gpu_tune.py")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "machine-supervise.json").write_text(json.dumps(machine(), indent=1))
    sys.exit(asyncio.run(main(args.out, args.model, args.configs)))
