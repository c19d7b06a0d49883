"""The log-probability check on synthetic data: a faithful engine passes (also on flat distributions full of near
ties), shuffled logits, another model's logits and a wrong template fail; over HTTP against the stand-in engine
speaking vLLM's and llama-server's dialects, an HTTP error is a failed verdict and a dead port the one error."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from backend.engines.base import Api
from backend.engines.dialect import Position
from backend.serving.answers.check import LogprobCheckError, check_engine
from backend.serving.answers.comparison import Observed, compare, template_mismatch
from backend.serving.answers.reference import Reference
from backend.serving.answers.tolerance import TOLERANCES, tolerance_for
from tests.stub_engine import StubEngine, status

VOCAB = 400
TOP = 20
PROMPTS = [
    ("en", [1, 10, 11, 12, 2]),
    ("zh", [1, 20, 21, 22, 23, 2]),
    ("system", [1, 30, 31, 3, 32, 33, 2]),
]
Logits = Callable[[list[int]], np.ndarray]


def model(scale: float, seed: int = 0) -> Logits:
    """A deterministic 'model': logits of a prefix are seeded normals times `scale` (small scale: flat)."""

    def logits(prefix: list[int]) -> np.ndarray:
        digest = hashlib.sha256(f"{seed}:{prefix}".encode()).digest()
        return np.random.default_rng(int.from_bytes(digest[:8], "little")).normal(0.0, scale, VOCAB)

    return logits


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max()
    return x - m - math.log(float(np.exp(x - m).sum()))


def top_of(lp: np.ndarray, k: int = TOP) -> list[tuple[int, float]]:
    ids = np.argsort(-lp, kind="stable")[:k]
    return [(int(i), float(lp[i])) for i in ids]


def reference_from(logits: Logits, new_tokens: int = 8) -> Reference:
    """What backend.child.logprob_reference writes, computed from a synthetic model."""
    prompts = []
    for name, ids in PROMPTS:
        seq, positions = list(ids), []
        for _ in range(new_tokens):
            lp = log_softmax(logits(seq))
            token = int(lp.argmax())
            positions.append({"top": [list(t) for t in top_of(lp)], "chosen_logprob": float(lp[token])})
            seq.append(token)
        prompts.append(
            {
                "name": name,
                "messages": [{"role": "user", "content": name}],
                "prompt_ids": ids,
                "continuation_ids": seq[len(ids) :],
                "positions": positions,
            }
        )
    return Reference.from_dict({"version": 1, "model": "synthetic", "dtype": "float32", "top": TOP, "prompts": prompts})


def observe(reference: Reference, logits: Logits, noise: float = 0.0, seed: int = 1) -> Observed:
    """An engine computing `logits` (plus Gaussian noise), teacher-forced on the reference's ids."""
    rng = np.random.default_rng(seed)
    observed = Observed()
    for prompt in reference.prompts:
        seq, positions = list(prompt.prompt_ids), []
        for token in prompt.continuation_ids:
            lp = log_softmax(logits(seq) + rng.normal(0.0, noise, VOCAB))
            positions.append(Position(top_of(lp), float(lp[token])))
            seq.append(token)
        observed.positions[prompt.name] = positions
        observed.prompt_ids[prompt.name] = list(prompt.prompt_ids)
    return observed


def shuffled(logits: Logits, seed: int = 7) -> Logits:
    perm = np.random.default_rng(seed).permutation(VOCAB)
    return lambda prefix: logits(prefix)[perm]


BF16 = TOLERANCES["bfloat16"]


@pytest.mark.parametrize("scale", [0.25, 1.0, 4.0])
def test_a_faithful_engine_with_small_noise_passes(scale: float) -> None:
    truth = model(scale)
    reference = reference_from(truth)
    verdict = compare(reference, observe(reference, truth, noise=0.01), BF16)
    assert verdict.passed, verdict.reason
    assert verdict.stats.positions == 24
    assert verdict.stats.median < 0.02
    assert verdict.stats.topk_misses == 0


def test_an_exact_engine_passes_the_float32_preset() -> None:
    truth = model(1.0)
    reference = reference_from(truth)
    verdict = compare(reference, observe(reference, truth), TOLERANCES["float32"])
    assert verdict.passed, verdict.reason
    assert verdict.stats.max == 0.0 and verdict.stats.top1_agree == 24
    assert "24 positions" in verdict.reason


def test_a_flat_random_model_full_of_near_ties_passes() -> None:
    """A random-weight model: nearly flat distributions, so the top-1 flips under noise and is not asked for."""
    truth = model(0.05)
    reference = reference_from(truth)
    observed = observe(reference, truth, noise=0.01)
    verdict = compare(reference, observed, BF16)
    assert verdict.passed, verdict.reason
    assert verdict.stats.near_ties_skipped == verdict.stats.positions
    assert verdict.stats.top1_agree < verdict.stats.positions, "the noise does reorder the near ties"


def top_token_missed(reference: Reference) -> str:
    """The first failure the top-k rule reports: the reference's top token at the first position, not listed."""
    first = reference.prompts[0]
    return (
        f"prompt {first.name!r} position 0: the reference's top token {first.positions[0].top[0][0]} "
        f"is not in the engine's top {BF16.top_k}"
    )


@pytest.mark.parametrize(("scale", "caught_by"), [(0.05, "overlap"), (0.25, "top-k"), (1.0, "top-k"), (4.0, "top-k")])
def test_shuffled_logits_fail(scale: float, caught_by: str) -> None:
    """Also on the flat distributions (0.05) where every position is a near tie: the top lists stop overlapping."""
    truth = model(scale)
    reference = reference_from(truth)
    verdict = compare(reference, observe(reference, shuffled(truth)), BF16)
    assert not verdict.passed
    assert verdict.stats.topk_overlap_mean < min(0.3, BF16.min_overlap)
    if caught_by == "overlap":  # the top-k rule skips near ties: the overlap rule alone names the failure
        assert verdict.stats.topk_misses == 0
        assert verdict.reason.startswith(
            f"the engine's top lists share {verdict.stats.topk_overlap_mean:.2f} of the reference's tokens on average"
        )
    else:  # the first position already misses the reference's top token
        assert verdict.stats.topk_misses > 0
        assert verdict.reason.startswith(top_token_missed(reference))


def test_another_models_logits_fail() -> None:
    reference = reference_from(model(1.0, seed=0))
    verdict = compare(reference, observe(reference, model(1.0, seed=99)), BF16)
    assert not verdict.passed
    assert verdict.stats.topk_misses == verdict.stats.positions > 0, "no position's top token is in the other's top"
    assert verdict.reason.startswith(top_token_missed(reference))


def test_logits_off_by_more_than_the_tolerance_fail() -> None:
    """A kernel that is only somewhat wrong (noise of 0.3 nats) fails the bfloat16 preset, not just a wild one."""
    truth = model(1.0)
    reference = reference_from(truth)
    verdict = compare(reference, observe(reference, truth, noise=0.3), BF16)
    assert not verdict.passed
    # the top tokens still agree (no top-k miss, no template mismatch): the median |Δ| is what fails, named first
    assert verdict.stats.topk_misses == 0 and verdict.stats.template_mismatches == 0
    assert verdict.stats.median > BF16.median_nats
    assert verdict.reason.startswith(f"median |Δ logprob| {verdict.stats.median:.4f} nats exceeds {BF16.median_nats}")


def test_a_wrong_template_fails_and_says_where() -> None:
    truth = model(1.0)
    reference = reference_from(truth)
    observed = observe(reference, truth)
    observed.prompt_ids["zh"] = [1, 20, 21, 99, 23, 2]
    verdict = compare(reference, observed, BF16)
    assert not verdict.passed
    assert verdict.stats.template_mismatches == 1
    assert "prompt 'zh'" in verdict.reason and "at position 3" in verdict.reason


def test_template_mismatch_messages() -> None:
    assert template_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert "renders 4 tokens" in (template_mismatch([1, 2, 3], [0, 1, 2, 3]) or "")
    assert "at position 0" in (template_mismatch([1, 2, 3], [0, 1, 2, 3]) or "")
    assert "at position 2 (engine nothing, model 3)" in (template_mismatch([1, 2, 3], [1, 2]) or "")


def test_missing_positions_and_engine_errors_fail() -> None:
    truth = model(1.0)
    reference = reference_from(truth)
    observed = observe(reference, truth)
    observed.positions["en"] = observed.positions["en"][:3]
    del observed.positions["zh"]
    observed.errors["system"] = "POST /v1/completions answered HTTP 500"
    verdict = compare(reference, observed, BF16)
    assert not verdict.passed
    assert "gave 3 positions" in verdict.reason and "(and 2 more)" in verdict.reason


def test_tolerance_presets() -> None:
    assert set(TOLERANCES) >= {"float32", "bfloat16", "q8_0", "q4_k_m", "q4_1"}
    assert tolerance_for("auto") == tolerance_for("bf16") == tolerance_for("F16") == TOLERANCES["bfloat16"]
    assert tolerance_for("Q4_K_M") == TOLERANCES["q4_k_m"]
    assert TOLERANCES["float32"].max_nats < TOLERANCES["bfloat16"].max_nats <= TOLERANCES["q4_k_m"].max_nats
    with pytest.raises(ValueError, match="no log-probability tolerance"):
        tolerance_for("int3")


def test_reference_file_round_trip(tmp_path: Path) -> None:
    reference = reference_from(model(1.0))
    path = tmp_path / "ref.json"
    data = {
        "version": 1,
        "model": reference.model,
        "dtype": "float32",
        "top": TOP,
        "seconds": 1.5,
        "prompts": [
            {
                "name": p.name,
                "messages": p.messages,
                "prompt_ids": p.prompt_ids,
                "continuation_ids": p.continuation_ids,
                "positions": [
                    {"top": [list(t) for t in q.top], "chosen_logprob": q.chosen_logprob} for q in p.positions
                ],
            }
            for p in reference.prompts
        ],
    }
    path.write_text(json.dumps(data))
    loaded = Reference.load(path)
    assert loaded.prompts == reference.prompts and loaded.seconds == 1.5
    with pytest.raises(ValueError, match="version"):
        Reference.from_dict({**data, "version": 2})


# ------------------------------------------------------------------------------------ stub servers over HTTP


def synthetic_engine(kind: str, logits: Logits, reference: Reference) -> StubEngine:
    """The stand-in engine speaking `kind`'s dialect (tests/stub_engine.py) from a synthetic model: its chat template
    renders the reference's conversations as their prompt ids, its log-probabilities are `logits`' softmax."""
    templates = {json.dumps(p.messages): p.prompt_ids for p in reference.prompts}
    return StubEngine(
        dialect=kind,
        tokens=lambda messages: templates[json.dumps(messages)],
        logprobs=lambda prefix: log_softmax(logits(prefix)),
    )


@pytest.fixture
def truth_and_reference() -> Iterator[tuple[Logits, Reference]]:
    truth = model(1.0)
    yield truth, reference_from(truth, new_tokens=4)


@pytest.mark.parametrize("kind", ["vllm", "llama.cpp"])
async def test_check_engine_passes_a_faithful_server(kind: str, truth_and_reference: tuple[Logits, Reference]) -> None:
    truth, reference = truth_and_reference
    with synthetic_engine(kind, truth, reference) as stub:
        verdict = await check_engine(stub.url, "sk-x", "m", Api(kind), reference, TOLERANCES["float32"], 10)
    assert verdict.passed, verdict.reason
    assert verdict.stats.max < 1e-6 and verdict.stats.positions == 12
    assert stub.authorizations == {"Bearer sk-x"}


@pytest.mark.parametrize("kind", ["vllm", "llama.cpp"])
async def test_check_engine_fails_a_server_with_shuffled_logits(
    kind: str, truth_and_reference: tuple[Logits, Reference]
) -> None:
    truth, reference = truth_and_reference
    with synthetic_engine(kind, shuffled(truth), reference) as stub:
        verdict = await check_engine(stub.url, "k", "m", Api(kind), reference, BF16, 10)
    assert not verdict.passed


@pytest.mark.parametrize(
    ("kind", "fault", "words"),
    [("vllm", "fail", ["HTTP 500"]), ("llama.cpp", "add_bos", ["evaluated", "BOS"])],
    ids=["an HTTP error", "a llama-server that adds a BOS"],
)
async def test_a_faulty_server_gives_a_failed_verdict_that_says_why(
    truth_and_reference: tuple[Logits, Reference], kind: str, fault: str, words: list[str]
) -> None:
    truth, reference = truth_and_reference
    with synthetic_engine(kind, truth, reference) as stub:
        if fault == "fail":
            stub.script = (status(500, "boom"),)  # every request
        else:
            stub.bos_added = True
        verdict = await check_engine(stub.url, "k", "m", Api(kind), reference, BF16, 10)
    assert not verdict.passed
    assert all(w in verdict.reason for w in words), verdict.reason


async def test_a_dead_port_raises_the_documented_error(
    truth_and_reference: tuple[Logits, Reference],
) -> None:
    _, reference = truth_and_reference
    with synthetic_engine("vllm", model(1.0), reference) as stub:
        url = stub.url  # the port is free again once the stub is gone
    with pytest.raises(LogprobCheckError, match="could not be reached"):
        await check_engine(url, "k", "m", Api.VLLM, reference, BF16, 5)
