"""Issue 43 on one GPU, one device call: FP8 priced against bf16, and where the first token's time goes at 16 users.

usage: python scripts/gpu/gpu_price.py OUT_DIR MODEL_DIR   (run by `bash scripts/gpu/gpu_run.sh price`)

1. Random but real weights of the model folder's architecture (transformers `from_config`, seed 0, saved in
   bfloat16), so the answer check has a reference on the same weights (`--load-format dummy` has none).
2. The engines of PRICE_CONFIGS (default: bf16, fp8, fp8kv, b2048) started at once through the project's supervisor
   (Engine.from_config), each with the same fixed KV cache (--kv-cache-memory-bytes: no memory profiling that
   another engine's start could disturb) and a share of the GPU's memory. One engine is measured at a time; the
   others are idle (nothing scheduled, their GPU work stopped).
3. The answer check of each engine against the float32 reference (backend.child.logprob_reference, computed
   meanwhile): its figures, whatever the verdict.
4. PRICE_ROUNDS rounds (3), the order of the engines turning each round: per engine output tok/s, TTFT and TPOT at
   1 / 16 / 64 users (512-token prompts, 256 output tokens, greedy, ignore_eos) with vLLM's per-phase histograms;
   and on the bf16 engine, at 16 users, the same prompts three ways: /v1/chat/completions (vLLM alone), /v1/completions
   with the prompt's token ids (what vLLM costs without templating and tokenizing), and the app's ChatClient; then
   conversations of ~10k and ~16k tokens grown by one short message at a time (the history in vLLM's prefix cache),
   the same three ways, one user.
5. The engines' memory (nvidia-smi per process, the log's weights and KV figures); each engine's log.
Everything is written to OUT_DIR as it is measured (price.json).
Env for a short call: PRICE_DUMMY=1 (vLLM's dummy weights, no answer check), PRICE_RESERVE_S (seconds kept for the
measurements when waiting for the engines, 240), PRICE_MIN_ROUND_S (the least time left to start a round, 90),
PRICE_EXTRAS=0 (the engines' levels only: no first token four ways or long chats on bf16, no fresh start at the end,
and no import times in gpu_run.sh; FP8 priced alone).
Each engine's answer check uses the limits the app applies to its format (`fp8` where the quantization or the KV
cache is FP8, else `bfloat16`); FP8 engines are also held to bfloat16's limits, for information (`check_bf16_limits`).
vLLM 0.26 needs compressed-tensors (and loguru) for any --quantization: carry their wheels in .whl.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import itertools

from gpu_metrics import log_excerpt, machine, metrics_delta, out_and_model, scrape

from backend.benchmarks.loadgen import AppSender, RawSender, Sampling, run_level
from backend.benchmarks.stats import RequestResult, level_metrics
from backend.benchmarks.workload import WORDS, BenchRequest
from backend.chat.client import ChatClient, event_lines
from backend.config import load_config
from backend.engines.base import Api, Endpoint
from backend.models.prompt_ids import verified
from backend.serving.answers.check import check_engine
from backend.serving.answers.reference import Reference
from backend.serving.answers.tolerance import tolerance_for
from backend.serving.launch import make_supervisor
from backend.serving.supervisor import Supervisor

KV_BYTES = 6 << 30  # the same KV cache for every engine: 6 GiB
COMMON = ["--attention-backend", "TRITON_ATTN", "--kv-cache-memory-bytes", str(KV_BYTES)]
# name: engine.flags on top of the h200 profile (max_model_len 16384, 256 sequences, 8192 tokens a step)
CONFIGS: dict[str, dict[str, str]] = {
    "bf16": {},
    "fp8": {"QUANTIZATION": "fp8"},
    "fp8kv": {"QUANTIZATION": "fp8", "KV_CACHE_DTYPE": "fp8"},
    "kvfp8": {"KV_CACHE_DTYPE": "fp8"},
    # The prefill of a wave of 16 prompts in steps of 2,048 tokens instead of one of 8,192: each prompt's first
    # token comes when its own chunk is done.
    "b2048": {"MAX_NUM_BATCHED_TOKENS": "2048"},
}
ORDER = os.environ.get("PRICE_CONFIGS", "bf16,fp8,fp8kv,b2048").split(",")
ROUNDS = int(os.environ.get("PRICE_ROUNDS", "3"))
EXTRAS = os.environ.get("PRICE_EXTRAS", "1") != "0"  # bf16's first token four ways, long chats, a fresh start
DEADLINE = float(os.environ.get("TUNE_DEADLINE", time.time() + 540))
LEVELS = [(1, 8), (16, 64), (64, 192)]  # (users, requests); b2048: 16 and 64 only
INPUT_LEN, OUTPUT_LEN = 512, 256
LONG = (10_000, 16_000)  # conversation lengths, tokens
LONG_TURNS = 6  # measured messages per conversation (one more first, unmeasured: it fills the prefix cache)
SAMPLING = Sampling(temperature=0.0, top_p=1.0)
# At 16 users and in long chats, the same prompts: vLLM alone (chat completions), vLLM given the prompt's ids
# (completions), the app's client sending messages, the app's client sending its own ids (models.prompt_ids)
WAYS = ["chat", "ids", "app", "app-ids"]
doc: dict[str, Any] = {}


def save(out: Path) -> None:
    (out / "price.json").write_text(json.dumps(doc, indent=1))


def left() -> float:
    return DEADLINE - time.time()


def make_weights(src: str, dst: Path) -> float:
    """The folder `src` with random but real bf16 weights (seed 0) in `dst`; seconds taken (in a child process)."""
    t0 = time.monotonic()
    code = (
        "import sys, shutil, torch, transformers as t; src, dst = sys.argv[1], sys.argv[2]\n"
        "shutil.copytree(src, dst, dirs_exist_ok=True); torch.manual_seed(0)\n"
        "cfg = t.AutoConfig.from_pretrained(src); m = t.AutoModelForCausalLM.from_config(cfg)\n"
        "m.to(torch.bfloat16).save_pretrained(dst); print('weights', sum(p.numel() for p in m.parameters()))"
    )
    subprocess.run([sys.executable, "-c", code, src, str(dst)], check=True)
    return round(time.monotonic() - t0, 1)


class Engine:
    """One engine as the app starts it (its supervisor: the app's flags, checks and start) and the app's client for
    it. (Not the chat service: this script runs beside the vLLM bundle without the app's web packages.)"""

    def __init__(self, model: Path, name: str, load_format: str = "auto") -> None:
        env = {
            **os.environ,
            "ERNIE_ENGINE__NAME": "vllm",
            "ERNIE_ENGINE__PYTHON": sys.executable,
            "ERNIE_ENGINE__PROFILE": "h200",
            "ERNIE_ENGINE__FLAGS__GPU_MEMORY_UTILIZATION": "0.18",
            "ERNIE_ENGINE__FLAGS__EXTRA_ARGS": json.dumps(COMMON),
            "ERNIE_MODEL__ID": str(model),
            "ERNIE_MODEL__LOAD_FORMAT": load_format,
            "ERNIE_CANARY__ENABLED": "false",  # checked below, with its figures whatever the verdict
            "ERNIE_SERVER__PORT": "0",
            "ERNIE_PATHS__DATA_DIR": f"/tmp/price/{name}",
            "ERNIE_PATHS__CACHE_DIR": "/tmp/price/cache",
            "ERNIE_TIMEOUTS__STARTUP_S": "420",
            "ERNIE_RESTART__MAX_ATTEMPTS": "1",
            **{f"ERNIE_ENGINE__FLAGS__{k}": v for k, v in CONFIGS[name].items()},
        }
        self.name = name
        self.supervisor: Supervisor = make_supervisor(load_config(environ=env))
        self.client = ChatClient(self.supervisor.endpoint, read_timeout_s=600, retries=0)

    @property
    def endpoint(self) -> Endpoint:
        return self.supervisor.endpoint

    def start(self) -> None:
        self.supervisor.start_background()

    async def stop(self) -> None:
        await self.supervisor.stop()
        await self.client.aclose()


class Prompts:
    """Chat prompts of ~`n` tokens and their token ids, rendered and tokenized by the model's own tokenizer."""

    def __init__(self, model: Path) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(model))
        self.rng = random.Random(43)
        self.serial = 0

    def ids(self, messages: list[dict[str, str]]) -> list[int]:
        out = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(out, list):  # transformers 5: a BatchEncoding
            out = out["input_ids"]
        return [int(t) for t in out]

    def text(self, n: int) -> str:
        self.serial += 1
        words = self.rng.choices(WORDS, k=n)
        return f"[#{self.serial:05d}] " + " ".join(words)

    def one(self, n: int) -> tuple[list[dict[str, str]], list[int]]:
        """A one-message chat of about `n` prompt tokens (the words per token measured on the first)."""
        if not hasattr(self, "per_word"):
            probe = [{"role": "user", "content": self.text(400)}]
            self.per_word = len(self.ids(probe)) / 400
        messages = [{"role": "user", "content": self.text(max(1, round(n / self.per_word)))}]
        return messages, self.ids(messages)


class IdsSender:
    """/v1/completions with the prompt's token ids: vLLM neither renders nor tokenizes."""

    def __init__(self, base_url: str, api_key: str, model: str, ids: dict[str, list[int]]) -> None:
        self.url = base_url + "/v1/completions"
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.model = model
        self.ids = ids  # request label -> prompt ids
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10), trust_env=False, limits=limits)

    async def __call__(self, request: BenchRequest) -> RequestResult:
        body = {"model": self.model, "prompt": self.ids[request.label], "stream": True,
                "stream_options": {"include_usage": True}, **SAMPLING.body(request.max_tokens)}  # fmt: skip
        result = RequestResult(success=False)
        start = time.perf_counter()
        times: list[float] = []
        try:
            async with self.http.stream("POST", self.url, json=body, headers=self.headers) as resp:
                if resp.status_code != 200:
                    result.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                    return result
                async for line in event_lines(resp):
                    if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                        continue
                    data = json.loads(line[5:])
                    if data.get("choices"):
                        times.append(time.perf_counter())
                        if result.first_text is None and data["choices"][0].get("text"):
                            result.first_text = times[-1] - start
                    elif usage := data.get("usage"):
                        result.output_tokens = int(usage.get("completion_tokens") or 0)
                        result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        except (httpx.HTTPError, ValueError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"[:300]
            return result
        if not times:
            result.error = "no chunk"
            return result
        result.success = True
        result.ttft = times[0] - start
        result.itl = [b - a for a, b in itertools.pairwise(times)]
        result.latency = times[-1] - start
        return result

    async def aclose(self) -> None:
        await self.http.aclose()


def brief(level: dict[str, Any]) -> str:
    t = level.get("ttft_ms") or {}
    p = level.get("phases", {}).get("time_to_first_token_seconds", {})
    return (f"{level.get('output_tokens_per_s', 0):.0f} tok/s, TTFT P50/P99 {t.get('p50', 0):.1f}/"
            f"{t.get('p99', 0):.1f} ms (mean {t.get('mean', 0):.1f}; vLLM's {p.get('mean_ms')}), errors "
            f"{level.get('errors')}")  # fmt: skip


async def level(svc: Engine, send: Any, requests: list[BenchRequest], users: int) -> dict[str, Any]:
    """One level: the requests at `users` at once; its figures and vLLM's per-phase histograms over it."""
    root = svc.endpoint.base_url
    headers = {"Authorization": f"Bearer {svc.endpoint.api_key}"}
    async with httpx.AsyncClient(timeout=10, trust_env=False, headers=headers) as http:
        before = await scrape(http, root)
        results, wall = await run_level(send, requests, users)
        out = level_metrics(users, results, wall).to_dict()
        out["phases"] = metrics_delta(before, await scrape(http, root))
    return out


async def main(out: Path, model_src: str) -> None:
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (the script's own steps, before anything runs)
    doc["machine"] = machine()
    doc["order"], doc["rounds_asked"], doc["kv_bytes"] = ORDER, ROUNDS, KV_BYTES
    real = Path("/tmp/price/ernie-real")
    load_format = "auto"
    try:
        if os.environ.get("PRICE_DUMMY"):  # speed and memory only, no answer check: vLLM's own random weights
            raise OSError("PRICE_DUMMY is set")
        doc["weights_s"] = make_weights(model_src, real)
    except (subprocess.CalledProcessError, OSError) as exc:  # the speed figures still count: vLLM's dummy weights
        doc["weights_error"] = f"{type(exc).__name__}: {exc}"
        print(f"[price] no real weights ({doc['weights_error']}): dummy weights, no answer check", flush=True)
        real, load_format = Path(model_src), "dummy"
    ref_path = Path("/tmp/price/reference.json")
    ref_proc = subprocess.Popen(  # noqa: ASYNC220 (the float32 reference, while the engines start)
        [sys.executable, "-m", "backend.child.logprob_reference", str(real), str(ref_path), "--threads", "8"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    services: dict[str, Engine] = {}
    t0 = time.monotonic()
    for name in ORDER:
        services[name] = Engine(real, name, load_format)
        services[name].start()
        await asyncio.sleep(3)
    try:
        # Bounded so that the measurements keep their time: an engine not ready by then is stopped and left out.
        wait_s = min(420.0, max(60.0, left() - float(os.environ.get("PRICE_RESERVE_S", "240"))))
        ready = await asyncio.gather(*(s.supervisor.wait_ready(wait_s) for s in services.values()))
        doc["start_s"] = round(time.monotonic() - t0, 1)
        doc["engines"] = {}
        for (name, svc), ok in zip(services.items(), ready, strict=True):
            sup = svc.supervisor
            doc["engines"][name] = {"ready": ok, "argv": sup.spec.argv if sup.spec else None, "pid": sup.status.pid}
            if not ok:
                doc["engines"][name]["error"] = f"{sup.status.error}\n{sup.status.log_tail}"
        running = {n: s for n, s in services.items() if doc["engines"][n]["ready"]}
        for name, svc in services.items():
            if name not in running:
                await svc.stop()
        doc["memory"] = memory(running)  # at once, so that a call cut short keeps it
        print(
            f"[price] started in {doc['start_s']} s: {[(n, e['ready']) for n, e in doc['engines'].items()]}", flush=True
        )
        save(out)
        try:
            ref_out, _ = await asyncio.to_thread(ref_proc.communicate, None, max(10, left() - 300))
            doc["reference_log"] = ref_out.decode(errors="replace")[-2000:]
            reference = Reference.load(ref_path)
            for name, svc in running.items():
                ep = svc.endpoint
                fmt = "fp8" if "fp8" in CONFIGS[name].values() else "bfloat16"  # the app's limits for the format
                verdict = await check_engine(ep.base_url, ep.api_key, ep.model, Api.VLLM, reference, tolerance_for(fmt))
                doc["engines"][name]["check"] = {**verdict.to_dict(), "limits": fmt}
                print(f"[price] check {name} ({fmt} limits): {verdict.passed} {verdict.reason[:300]}", flush=True)
                if fmt != "bfloat16":  # the same engine held to 16-bit's limits, for information
                    strict = await check_engine(
                        ep.base_url, ep.api_key, ep.model, Api.VLLM, reference, tolerance_for("bfloat16")
                    )
                    doc["engines"][name]["check_bf16_limits"] = strict.to_dict()
                    print(f"[price] check {name} (bfloat16 limits): {strict.passed} {strict.reason[:300]}", flush=True)
        except Exception as exc:  # the figures of the rest still count
            if ref_proc.poll() is None:  # no reference process left running beside the measurements
                ref_proc.kill()
            doc["check_error"] = f"{type(exc).__name__}: {exc}"
            print(f"[price] check failed: {doc['check_error']}", flush=True)
        save(out)

        prompts = Prompts(real)
        base = running.get("bf16")
        for name, svc in running.items():  # unmeasured: the shapes of the levels, compiled at first use
            raw = RawSender(svc.endpoint.base_url, svc.endpoint.api_key, svc.endpoint.model, SAMPLING)
            for users, n in ((16, 16), (64, 64)):
                await run_level(
                    raw, [BenchRequest(prompts.one(INPUT_LEN)[0], 32, f"warm-{name}-{i}") for i in range(n)], users
                )
            await raw.aclose()
        # The app's own ids where they are vLLM's for the sample conversations (as ChatService.use_prompt_ids decides)
        app_ids = await verified(real, base.client.engine_ids) if base is not None else None
        doc["app_prompt_ids"] = app_ids is not None
        print(f"[price] the app's prompt ids: {app_ids is not None}", flush=True)
        doc["rounds"] = []
        names = list(running)
        longest = 0.0
        for r in range(ROUNDS):
            if left() < max(float(os.environ.get("PRICE_MIN_ROUND_S", "90")), 1.1 * longest):
                print(f"[price] round {r}: skipped, {left():.0f} s left", flush=True)
                break
            began = time.monotonic()
            rec: dict[str, Any] = {"round": r, "order": names[r % len(names) :] + names[: r % len(names)]}
            for name in rec["order"]:
                svc = running[name]
                raw = RawSender(svc.endpoint.base_url, svc.endpoint.api_key, svc.endpoint.model, SAMPLING)
                rec[name] = {}
                for users, n in LEVELS:
                    if name == "b2048" and users == 1:
                        continue
                    reqs = [
                        BenchRequest(prompts.one(INPUT_LEN)[0], OUTPUT_LEN, f"{name}-{r}-{users}-{i}") for i in range(n)
                    ]
                    rec[name][str(users)] = got = await level(svc, raw, reqs, users)
                    print(f"[price] r{r} {name} c={users}: {brief(got)}", flush=True)
                await raw.aclose()
                if name == "bf16" and base is not None and EXTRAS:  # the first token at 16 users four ways
                    ep = base.endpoint
                    made = [prompts.one(INPUT_LEN) for _ in range(64)]
                    ids = {f"w{r}-{i}": m[1] for i, m in enumerate(made)}
                    reqs = [BenchRequest(m[0], OUTPUT_LEN, f"w{r}-{i}") for i, m in enumerate(made)]
                    senders = {"chat": RawSender(ep.base_url, ep.api_key, ep.model, SAMPLING),
                               "ids": IdsSender(ep.base_url, ep.api_key, ep.model, ids),
                               "app": AppSender(base.client, SAMPLING, 0.02),
                               "app-ids": AppSender(base.client, SAMPLING, 0.02)}  # fmt: skip
                    rec["ways16"] = {}
                    for way in WAYS if r % 2 == 0 else WAYS[::-1]:
                        base.client.prompt_ids = app_ids if way == "app-ids" else None
                        rec["ways16"][way] = got = await level(base, senders[way], reqs, 16)
                        print(f"[price] r{r} bf16 16 users via {way}: {brief(got)}", flush=True)
                    rec["long"] = await long_chats(base, prompts, senders, r, app_ids)
                    base.client.prompt_ids = app_ids
                    for s in senders.values():
                        if hasattr(s, "aclose"):
                            await s.aclose()
            rec["took_s"] = round(time.monotonic() - began, 1)
            longest = max(longest, rec["took_s"])
            doc["rounds"].append(rec)
            save(out)
        doc["memory"] = memory(running)
        save(out)
    finally:  # the engines stop whatever happened, and their logs are kept
        for svc in services.values():
            await svc.stop()
    for name, svc in services.items():
        doc["engines"][name]["log"] = log_excerpt(svc.supervisor.log_path)
        log = svc.supervisor.log_path
        if log.exists():
            (out / f"engine-{name}.log").write_text(log.read_text(errors="replace")[-400_000:])
    save(out)
    # A fresh start on the caches the first one filled, alone, its log at DEBUG
    if "bf16" in services and EXTRAS and left() > 150:
        os.environ["VLLM_LOGGING_LEVEL"] = "DEBUG"
        os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(ms_logging(Path("/tmp/price/logging.json")))
        svc = Engine(real, "bf16", load_format)
        log = svc.supervisor.log_path
        mark = log.stat().st_size if log.exists() else 0
        t0 = time.monotonic()
        svc.start()
        ok = await svc.supervisor.wait_ready(300)
        doc["fresh_start"] = {
            "ready": ok,
            "ready_s": round(time.monotonic() - t0, 1),
            "warmup_s": svc.supervisor.status.warmup_s,
        }
        print(f"[price] fresh start of bf16 on warm caches: {doc['fresh_start']}", flush=True)
        await svc.stop()
        if log.exists():
            (out / "engine-bf16-fresh.log").write_text(log.read_text(errors="replace")[mark:][-2_000_000:])
        save(out)


async def long_chats(base: Engine, prompts: Prompts, senders: dict[str, Any], r: int, app_ids: Any) -> dict[str, Any]:
    """Conversations of ~10k and ~16k tokens grown by one short message at a time, one user, the three ways."""
    got: dict[str, Any] = {}
    for size in LONG:
        history: list[dict[str, str]] = []
        while len(prompts.ids(history or [{"role": "user", "content": ""}])) < size - 600:
            history += [{"role": "user", "content": prompts.text(200)},
                        {"role": "assistant", "content": prompts.text(300)}]  # fmt: skip
        for way in WAYS if r % 2 == 0 else WAYS[::-1]:
            base.client.prompt_ids = app_ids if way == "app-ids" else None
            turns = [[*history, {"role": "user", "content": prompts.text(20)}] for _ in range(LONG_TURNS + 1)]
            labels = [f"long{size}-{way}-{r}-{i}" for i in range(len(turns))]
            senders["ids"].ids.update({lb: prompts.ids(t) for lb, t in zip(labels, turns, strict=True)})
            reqs = [BenchRequest(t, 8, lb) for t, lb in zip(turns, labels, strict=True)]
            await run_level(senders[way], reqs[:1], 1)  # the history into the prefix cache
            got[f"{size}-{way}"] = one = await level(base, senders[way], reqs[1:], 1)
            one["prompt_tokens"] = len(senders["ids"].ids[labels[-1]])
            hits = f"{one['phases'].get('prefix_cache_hits')}/{one['phases'].get('prefix_cache_queries')}"
            print(f"[price] r{r} long {size} via {way}: {brief(one)}, prefix hits {hits}", flush=True)
    return got


def ms_logging(path: Path) -> Path:
    """vLLM's own logging configuration with milliseconds in the time stamps (a start's phases to the ms)."""
    fmt = "%(levelname)s %(asctime)s.%(msecs)03d [%(fileinfo)s:%(lineno)d] %(message)s"
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"vllm": {"class": "vllm.logging_utils.NewLineFormatter", "datefmt": "%m-%d %H:%M:%S",
                                "format": fmt}},
        "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "vllm", "level": "DEBUG",
                              "stream": "ext://sys.stdout"}},
        "loggers": {"vllm": {"handlers": ["vllm"], "level": "DEBUG", "propagate": False}},
    }  # fmt: skip
    path.write_text(json.dumps(config))
    return path


def memory(running: dict[str, Engine]) -> dict[str, Any]:
    """GPU memory per engine process (nvidia-smi), and what each engine's log says of weights and KV cache."""
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True).stdout  # fmt: skip
    used = {int(p): int(m) for p, m in (ln.split(",") for ln in apps.strip().splitlines() if "," in ln)}
    out: dict[str, Any] = {}
    for name, svc in running.items():
        pids = set(_tree(svc.supervisor.status.pid or 0))
        lines = [ln for ln in log_excerpt(svc.supervisor.log_path) if "GiB" in ln or "KV cache size" in ln]
        out[name] = {"gpu_mib": sum(m for p, m in used.items() if p in pids), "log": lines[-6:]}
    return out


def _tree(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        pid, ppid = int(text.split(" ", 1)[0]), int(text[text.rindex(")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(pid)
    todo, seen = [root], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo += kids.get(pid, [])
    return seen


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args = out_and_model(parser)
    asyncio.run(main(args.out, args.model))
    print("[price] summary:", json.dumps({k: v for k, v in doc.items() if k in ("start_s", "weights_s")}), flush=True)
