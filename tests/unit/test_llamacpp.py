"""The llama.cpp engine without starting it: settings, command line, environment, GGUF choice and cache."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from backend.config import AppConfig, load_config
from backend.errors import ConfigError, EngineNotInstalledError, ModelConversionError, ModelNotFoundError
from backend.gguf_cache import cached_gguf, ensure_gguf, source_key
from backend.gguf_convert import ConversionError, check_source, split_fused
from backend.launch import make_supervisor
from backend.llamacpp import (
    HEALTH_PATH,
    build_llamacpp_launch,
    child_env,
    resolve_gguf,
    server_setting_names,
)
from backend.supervisor import State

SETTINGS = frozenset({"model", "model_alias", "n_ctx", "host", "port", "api_key", "verbose", "cache"})
KEY = "sk-local-secret"


def config(tmp_path: Path, **overrides: object) -> AppConfig:
    env = {
        "ERNIE_ENGINE__NAME": "llama.cpp",
        "ERNIE_SERVER__PORT": "0",
        "ERNIE_PATHS__DATA_DIR": str(tmp_path / "data"),
        "ERNIE_PATHS__CACHE_DIR": str(tmp_path / "cache"),
    }
    env.update({f"ERNIE_{k.upper()}": str(v) for k, v in overrides.items()})
    return load_config(environ=env)


def hf_folder(path: Path, arch: str = "Ernie4_5ForCausalLM", tokenizer: bool = True, weights: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"architectures": [arch]}))
    if tokenizer:
        (path / "tokenizer.model").write_bytes(b"spm")
    if weights:
        (path / "model.safetensors").write_bytes(b"weights")
    return path


def test_llamacpp_settings_have_defaults_and_env_overrides(tmp_path: Path) -> None:
    cfg = config(tmp_path, llamacpp__quantization="q4_k_m", llamacpp__n_ctx=2048)
    assert cfg.engine.name == "llama.cpp"
    assert (cfg.llamacpp.quantization, cfg.llamacpp.n_ctx, cfg.llamacpp.threads) == ("q4_k_m", 2048, 0)
    with pytest.raises(ConfigError, match=r"llamacpp\.quantization.*ERNIE_LLAMACPP__QUANTIZATION"):
        config(tmp_path, llamacpp__quantization="q5")
    with pytest.raises(ConfigError, match=r"llamacpp\.parallel: unknown key"):
        config(tmp_path, llamacpp__parallel=4)


def test_the_shipped_config_documents_the_llamacpp_section() -> None:
    cfg = load_config(environ={})
    assert cfg.llamacpp.quantization == "q8_0" and cfg.llamacpp.gguf is None


def test_command_line_names_the_model_and_never_the_key(tmp_path: Path) -> None:
    cfg = config(tmp_path, llamacpp__n_ctx=2048, llamacpp__threads=2, llamacpp__extra_args='["--n_ubatch", "256"]')
    spec = build_llamacpp_launch(cfg, "/m/x.gguf", 8123, KEY, "/py", SETTINGS)
    argv = spec.argv
    assert argv[:3] == ["/py", "-m", "llama_cpp.server"]
    pairs = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert pairs["--model"] == "/m/x.gguf" and pairs["--model_alias"] == cfg.model.served_name
    assert (pairs["--host"], pairs["--port"], pairs["--n_ctx"]) == ("127.0.0.1", "8123", "2048")
    assert pairs["--n_threads"] == pairs["--n_threads_batch"] == "2"
    assert pairs["--interrupt_requests"] == "False", "a new request must not cut the running reply"
    assert argv[-2:] == ["--n_ubatch", "256"]
    assert KEY not in " ".join(argv) and spec.env["API_KEY"] == KEY
    assert spec.health_path == HEALTH_PATH and spec.engine == "llama.cpp"
    assert spec.flags.max_model_len == 2048, "the app's context window is llama.cpp's n_ctx"


def test_threads_default_to_every_usable_core(tmp_path: Path) -> None:
    spec = build_llamacpp_launch(config(tmp_path), "/x.gguf", 1, KEY, "/py", SETTINGS)
    assert spec.argv[spec.argv.index("--n_threads") + 1] == str(len(os.sched_getaffinity(0)))


def test_child_env_drops_variables_the_server_would_read_as_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "MODEL": "/evil.gguf",
        "Host": "0.0.0.0",
        "PORT": "80",
        "N_CTX": "1",
        "CONFIG_FILE": "x",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("KEEP_ME", "1")
    env = child_env(KEY, SETTINGS)
    assert not {"MODEL", "Host", "PORT", "N_CTX", "CONFIG_FILE"} & set(env)
    assert env["KEEP_ME"] == "1" and env["API_KEY"] == KEY and env["PATH"] == os.environ["PATH"]


def test_missing_llama_cpp_names_the_install_command() -> None:
    with pytest.raises(EngineNotInstalledError, match=r"llama-cpp-python\[server\]==0\.3\.36"):
        server_setting_names(sys.executable)  # the app's interpreter has no llama_cpp


def test_configured_gguf_is_served_as_is_or_refused_when_missing(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_gguf(config(tmp_path, llamacpp__gguf=gguf), "/py", print).model == str(gguf)
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_gguf(config(tmp_path, llamacpp__gguf=tmp_path / "none.gguf"), "/py", print)
    assert resolve_gguf(config(tmp_path, model__id=gguf), "/py", print).model == str(gguf)


def test_a_model_folder_is_converted_once_from_the_cache(tmp_path: Path) -> None:
    src = hf_folder(tmp_path / "ernie")
    cfg = config(tmp_path, model__id=src, llamacpp__quantization="q4_k_m")
    target = cached_gguf(cfg, src, "q4_k_m")
    assert target.parent.parent == cfg.paths.cache / "gguf" and target.name == "ernie.q4_k_m.gguf"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"GGUF")
    notes: list[str | None] = []
    resolved = resolve_gguf(cfg, "/nonexistent/python", notes.append)  # a cache hit runs nothing
    assert resolved.model == str(target) and notes == []


def test_cache_key_follows_the_source_files(tmp_path: Path) -> None:
    src = hf_folder(tmp_path / "ernie")
    key = source_key(src)
    assert source_key(src) == key
    (src / "model.safetensors").write_bytes(b"other weights")
    assert source_key(src) != key
    (src / "README.md").write_text("not read by the conversion")
    assert cached_gguf(config(tmp_path), src, "bf16").parent.name.startswith("ernie-")


def test_a_failed_conversion_shows_the_log_tail(tmp_path: Path) -> None:
    src = hf_folder(tmp_path / "ernie")
    cfg = config(tmp_path)
    log_file = tmp_path / "convert.log"
    with pytest.raises(ModelConversionError, match=r"exit code 1[\s\S]*(No module named|error)") as info:
        ensure_gguf(cfg, sys.executable, src, "q8_0", log_file=log_file)  # no gguf package here
    assert str(log_file) in info.value.hint
    assert not cached_gguf(cfg, src, "q8_0").exists() and not cached_gguf(cfg, src, "bf16").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"arch": "LlamaForCausalLM"}, "LlamaForCausalLM; this converter handles ERNIE-4.5"),
        ({"tokenizer": False}, "no tokenizer.model"),
        ({"weights": False}, "no \\*.safetensors"),
    ],
)
def test_converter_refuses_folders_it_cannot_convert(tmp_path: Path, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConversionError, match=message):
        check_source(hf_folder(tmp_path / "m", **kwargs))  # type: ignore[arg-type]
    with pytest.raises(ConversionError, match=r"no config\.json"):
        check_source(tmp_path)


def test_fused_ernie_tensors_are_split_like_llama_cpp_does() -> None:
    cfg = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "hidden_size": 8}
    qkv = np.arange(16 * 8).reshape(16, 8)
    parts = dict(split_fused("ernie.layers.0.self_attn.qkv_proj.weight", qkv, cfg))
    assert [p.shape[0] for p in parts.values()] == [8, 4, 4]
    assert list(parts) == [f"model.layers.0.self_attn.{x}_proj.weight" for x in "qkv"]
    gate, up = split_fused("model.layers.1.mlp.up_gate_proj.weight", np.zeros((6, 8)), cfg)
    assert (gate[0], up[0]) == ("model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight")


async def test_supervisor_gives_up_with_the_install_hint_when_llama_cpp_is_missing(tmp_path: Path) -> None:
    cfg = config(tmp_path, llamacpp__python=sys.executable, restart__max_attempts=1, llamacpp__n_ctx=1024)
    supervisor = make_supervisor(cfg)
    assert supervisor.flags.max_model_len == 1024
    supervisor.start_background()
    try:
        assert not await supervisor.wait_ready(60)
        assert supervisor.status.state == State.FAILED
        assert "pip install 'llama-cpp-python[server]==0.3.36'" in (supervisor.status.hint or "")
    finally:
        await supervisor.stop()
