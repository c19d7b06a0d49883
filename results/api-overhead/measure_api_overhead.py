"""What the app's OpenAI-compatible API adds over the engine alone (issue 28), measured on chat-shaped work.

    .venv/bin/python results/api-overhead/measure_api_overhead.py [--model demo|ernie-random] [--rounds 3]
        [--levels 1,8]

One engine (llama.cpp, started here by the app's own supervisor, then left alone) is measured two ways,
alternated A B A B: directly at its /v1/chat/completions, and through the app (`chainlit run app.py` with login
on, a user's API key and its quotas checked on every request, the engine as `external`). Both with `bench
--workload chat`: conversations whose history grows, replies of an exact length (ignore_eos), the same
conversations on both. The request names the template `default` and brings its own system line, so the app sends
the engine what the direct run sends (on the demo model without the demo's penalties, which the direct run does
not ask for either). The app's key lives only in this process's environment (ERNIE_BENCH_API_KEY for the bench),
never in the results.

Models: `demo` (the offline demo model as a fresh clone serves it: llama.cpp on its own Q4_1 GGUF; its tokens are
text, so the first text the tool sees is timed) and `ernie-random` (q4_k_m of the ERNIE-0.3B architecture with
random weights: the real model's shapes, but tokens with almost no text, so only throughput compares).

Writes results/api-overhead/<model>/{results.json,report.md}; every run's own folder under runs/, and the CPU
seconds the app and the engine used in each run (on 2 cores, what the app uses the engine cannot).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from backend.accounts.passwords import hash_password
from backend.accounts.users import write_users_file
from backend.benchmarks.stats import spread
from backend.chat.service import ChatService
from backend.config import ROOT, load_config
from backend.engines.base import bearer
from backend.models.resolve import DEMO_NAME
from backend.serving.hardware import cpu_model

SPM = ROOT / ".cache" / "test-models" / "ernie-0.3b-spm2"
OUT = ROOT / "results" / "api-overhead"
# model: (what the engine is told, what the app is told, words for the report)
MODELS = {
    "demo": (
        {"ERNIE_MODEL__ID": "baidu/ERNIE-4.5-0.3B-PT"},  # the hub out of reach (HF_HUB_OFFLINE): the demo answers
        {"ERNIE_MODEL__ID": f"HuggingFaceTB/{DEMO_NAME}", "ERNIE_DEMO__FREQUENCY_PENALTY": "0",
         "ERNIE_DEMO__PRESENCE_PENALTY": "0"},
        f"llama.cpp, the offline demo model ({DEMO_NAME}, its own Q4_1 GGUF)",
    ),
    "ernie-random": (
        {"ERNIE_MODEL__ID": str(SPM), "ERNIE_LLAMACPP__QUANTIZATION": "q4_k_m"},
        {},
        "llama.cpp q4_k_m, ERNIE-0.3B architecture (random weights: tokens with almost no text)",
    ),
}  # fmt: skip
USER = "bench"
FIGURES = (
    ("output tok/s", "output_tok_s"),
    ("first token P50 ms", "first_chunk_ms.p50"),
    ("first text P50 ms", "first_text_ms.p50"),
    ("first text P90 ms", "first_text_ms.p90"),
    ("decode tok/s per reply P50", "decode_tok_s.p50"),
)


def cpu_s(pid: int | None) -> float:
    """CPU seconds a process (and its threads) used so far; 0 without one."""
    return sum(psutil.Process(pid).cpu_times()[:2]) if pid else 0.0


def figure(level: dict[str, Any], path: str) -> float | None:
    value: Any = level
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return None if value is None else float(value)


def bench(url: str, key: str, model: str, args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """One round of `bench --workload chat` against `url`; its levels' figures."""
    cmd = [
        sys.executable, "-m", "backend", "bench", "--out-dir", str(out), "--base-url", url, "--model", model,
        "--concurrency", args.levels, "--requests", str(args.requests), "--workload", "chat",
        "--reply-tokens", args.reply_tokens,
        "--app-concurrency", "none", "--no-baseline", "--no-progress", "--temperature", "0", "--repeat", "1",
    ]  # fmt: skip
    env = {**os.environ, "ERNIE_BENCH_API_KEY": key}
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, env=env)
    levels = json.loads((out / "results.json").read_text())["chat"]["levels"]
    return [{"users": lv["users"], **{path: figure(lv, path) for _, path in FIGURES}} for lv in levels]


def wait_healthy(url: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            body = httpx.get(url + "/healthz", timeout=5, trust_env=False).json()
            if body.get("status") == "ok" or body.get("ready"):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(1)
    raise SystemExit(f"the app at {url} did not become ready in {timeout_s:.0f} s")


def start_app(
    base_url: str, api_key: str, model: str, work: Path, port: int, extra_env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], str, str]:
    """The app with login on in front of the engine (`external`), a user with a key; (its process, URL, the key)."""
    users = work / "users.yaml"
    write_users_file(users, {USER: hash_password("bench-password-not-secret")})
    app_env = {k: v for k, v in os.environ.items() if not k.startswith("ERNIE_")}
    app_env.update({
        "ERNIE_PATHS__DATA_DIR": str(work / "app"),
        "ERNIE_AUTH__ENABLED": "true",
        "ERNIE_AUTH__USERS_FILE": str(users),
        "ERNIE_ENGINE__NAME": "external",
        "ERNIE_SERVER__BASE_URL": base_url,
        "ERNIE_SERVER__API_KEY": api_key,
        "ERNIE_MODEL__SERVED_NAME": model,
        # quotas checked on every request, set so that none is reached
        "ERNIE_API__QUOTAS__CONCURRENT": "64",
        "ERNIE_API__QUOTAS__REQUESTS_PER_MINUTE": "100000",
        "ERNIE_API__QUOTAS__TOKENS_PER_DAY": "1000000000",
        **extra_env,
    })  # fmt: skip
    made = subprocess.run(
        [sys.executable, "-m", "backend", "api-key", "create", USER],
        cwd=ROOT, env=app_env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    user_key = made.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\S{20,}", user_key), "api-key create printed no key"
    with (work / "app.log").open("ab") as log:
        app = subprocess.Popen(
            [sys.executable, "-m", "chainlit", "run", "app.py", "--headless", "--port", str(port)],
            cwd=ROOT, env=app_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url)
    return app, url, user_key


def start_engine(model: str, work: Path) -> ChatService:
    """llama.cpp serving `model` (MODELS), started by the app's supervisor (offline), then left alone."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    engine_env = {
        "ERNIE_SERVER__PORT": "0",
        "ERNIE_PATHS__DATA_DIR": str(work / "engine"),
        "ERNIE_ENGINE__NAME": "llama.cpp",
        **MODELS[model][0],
        **{k: v for k, v in os.environ.items() if k == "ERNIE_PATHS__CACHE_DIR"},
    }
    service = ChatService.from_config(load_config(environ=engine_env))
    service.start()
    return service


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="demo")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--levels", default="1,8")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--port", type=int, default=8599)
    parser.add_argument("--reply-tokens", default="60-100", help="LOW-HIGH, exact (ignore_eos)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="api-overhead-"))
    out_dir = OUT / args.model
    service = start_engine(args.model, work)
    app: subprocess.Popen[bytes] | None = None
    load_start = [round(x, 2) for x in os.getloadavg()]
    try:
        if not await service.supervisor.wait_ready(900):
            raise SystemExit(f"engine not ready: {service.supervisor.status}")
        ep = service.endpoint
        told = MODELS[args.model][1]
        app, app_url, user_key = await asyncio.to_thread(
            start_app, ep.base_url, ep.api_key, ep.model, work, args.port, told
        )
        app_pid = app.pid if app is not None else None
        targets = {"engine alone": (ep.base_url, ep.api_key), "through the app's API": (app_url, user_key)}
        listed = await asyncio.to_thread(httpx.get, app_url + "/v1/models", headers=bearer(user_key), trust_env=False)
        default = next(m["id"] for m in listed.json()["data"] if m["id"].endswith(":default"))
        model = {"engine alone": ep.model, "through the app's API": default}  # the template `default`, by name
        runs: list[dict[str, Any]] = []
        for r in range(1, args.rounds + 1):
            for name, (url, key) in targets.items():
                before = [round(x, 2) for x in os.getloadavg()]
                out = out_dir / "runs" / f"{name.replace(' ', '_').replace(chr(39), '')}-r{r}"
                pids = {"app": app_pid, "engine": service.supervisor.status.pid}
                cpu = {who: cpu_s(pid) for who, pid in pids.items()}
                levels = await asyncio.to_thread(bench, url, key, model[name], args, out)
                used = {who: round(cpu_s(pid) - cpu[who], 1) for who, pid in pids.items()}
                runs.append({"target": name, "round": r, "levels": levels, "load_before": before,
                             "load_after": [round(x, 2) for x in os.getloadavg()], "cpu_s": used})  # fmt: skip
                print(json.dumps(runs[-1]), flush=True)
    finally:
        if app is not None:
            app.terminate()
            await asyncio.to_thread(app.wait, 30)
        await service.stop()
    summary: dict[str, dict[int, dict[str, Any]]] = {}
    for name in ("engine alone", "through the app's API"):
        per_level: dict[int, dict[str, Any]] = {}
        for users in sorted({lv["users"] for run in runs for lv in run["levels"]}):
            cells = {}
            for _, path in FIGURES:
                values = [lv[path] for run in runs if run["target"] == name for lv in run["levels"]
                          if lv["users"] == users and lv[path] is not None]  # fmt: skip
                cells[path] = spread(values).to_dict()
            per_level[users] = cells
        summary[name] = per_level
    meta = {
        "cpu": cpu_model(), "cores": os.cpu_count(), "created": time.strftime("%Y-%m-%d %H:%M %Z"),
        "rounds": args.rounds, "requests": args.requests, "levels": args.levels, "load_start": load_start,
        "load_end": [round(x, 2) for x in os.getloadavg()], "engine": MODELS[args.model][2],
        "command": " ".join(sys.argv),
    }  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": runs}, indent=1))
    lines = [
        "# What the app's API adds over the engine alone",
        "",
        f"CPU: {meta['cpu']}, {meta['cores']} cores; {meta['created']}. {meta['engine']}; `bench --workload chat`, "
        f"{args.requests} turns per level, replies of {args.reply_tokens} tokens, {args.rounds} rounds alternated "
        "(engine, app, engine, app, ...). "
        f"Load average {load_start} at the start, {meta['load_end']} at the end. Cells: median (min-max).",
        "",
        "| users | figure | engine alone | through the app's API | app / engine |",
        "|---|---|---|---|---|",
    ]
    for users in summary["engine alone"]:
        for title, path in FIGURES:
            a, b = summary["engine alone"][users][path], summary["through the app's API"][users][path]
            lines.append(
                f"| {users} | {title} | {a['median']:.1f} ({a['min']:.1f}-{a['max']:.1f}) | "
                f"{b['median']:.1f} ({b['min']:.1f}-{b['max']:.1f}) | {b['median'] / a['median']:.3f} |"
            )
    (out_dir / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    asyncio.run(main())
