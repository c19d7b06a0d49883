"""The engine tune's own logic: the rule, the kept result and its key, the candidates, the chat's progress line."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from backend.chat.i18n import t
from backend.chat.render import serving_status, wait_text
from backend.chat.turn import EngineWait, Serving
from backend.config import AppConfig, load_config
from backend.engines.base import Engine
from backend.engines.registry import engine, tunable
from backend.errors import Phrase
from backend.models.resolve import ResolvedModel
from backend.ops.doctor import places_text, tune_line
from backend.serving.profiles import effective_flags
from backend.tuning import kept, tuner
from backend.tuning.kept import Measured, Places, Round, TuneResult
from tests.unit.engines.test_llamacpp import fake_install


def config(tmp_path: Path, **overrides: object) -> AppConfig:
    env = {"ERNIE_PATHS__DATA_DIR": str(tmp_path / "data"), "ERNIE_PATHS__CACHE_DIR": str(tmp_path / "cache"),
           # no llama.cpp kernels installed: the builds measured do not depend on the machine the tests run on
           "ERNIE_LLAMACPP__PREFIX": str(tmp_path / "no-llama.cpp")}  # fmt: skip
    env.update({f"ERNIE_{k.upper()}": str(v) for k, v in overrides.items()})
    return load_config(environ=env)


def level(decode: float, first_ms: float, turns: int = 12) -> dict[str, Any]:
    """A chat level's summary as backend.benchmarks.chat_workload makes it (the fields the tune reads)."""
    return {"decode_tok_s": {"p50": decode, "min": decode}, "first_text_ms": {"p50": first_ms}, "output_tok_s": decode,
            "turns": turns}  # fmt: skip


def rounds(one: tuple[float, float], many: tuple[float, float], jitter: float = 0.0, count: int = 3) -> list[Round]:
    """`count` rounds around the given figures, each `jitter` (a share) quicker than the one before it."""
    out = []
    for i in range(count):
        f = 1 + jitter * (i - (count - 1) / 2)
        out.append(Round(level(one[0] * f, one[1] / f), level(many[0] * f, many[1] / f)))
    return out


def measured(label: str, one: tuple[float, float], many: tuple[float, float], jitter: float = 0.0) -> Measured:
    name, fmt = label.split(" ")
    return Measured(label, name, fmt, "measured", "passed", 1.0, rounds(one, many, jitter))


def test_the_rule_takes_the_soonest_typical_reply_alone_and_at_the_expected_users() -> None:
    # (1 user: decode tok/s, first text ms), (4 users: the same); a typical reply is 200 tokens
    a = measured("llama.cpp q8_0", (60, 200), (30, 300))  # sqrt(3.53 x 6.97) = 4.96 s
    b = measured("llama.cpp q4_k_m", (80, 180), (40, 280))  # sqrt(2.68 x 5.28) = 3.76 s
    c = measured("vllm-cpu bfloat16", (15, 250), (12, 400))  # 15.1 s
    assert tuner.choose([a, b, c]) is b
    assert tuner.reply_s(level(35, 280)) == pytest.approx(0.28 + 200 / 35)
    # The demo on today's AMD EPYC: llama.cpp 2.1x quicker alone, vllm-cpu 1.6x quicker at 4 users at once.
    llama = measured("llama.cpp q4_1", (93.2, 330), (22.1, 550))  # sqrt(2.48 x 9.6) = 4.88 s (mean: 6.04)
    vllm = measured("vllm-cpu bfloat16", (39.1, 145), (34.8, 400))  # sqrt(5.26 x 6.15) = 5.69 s (mean: 5.70)
    assert tuner.scores(llama)[0] < tuner.scores(vllm)[0]  # type: ignore[index]
    assert tuner.decide([llama, vllm]).chosen is llama  # 14 % quicker: within the margin, the default order decides
    assert "default order" in tuner.decide([vllm, llama]).reason
    slow_to_answer = measured("vllm-cpu bfloat16", (15, 9000), (32, 9000))  # decodes faster, answers 9 s later
    assert tuner.choose([a, slow_to_answer]) is a


def test_a_model_without_text_counts_from_its_first_token_and_no_figures_is_never_chosen() -> None:
    silent = {"decode_tok_s": {"p50": 50.0}, "first_text_ms": None, "first_chunk_ms": {"p50": 300.0}}
    assert tuner.reply_s(silent) == pytest.approx(0.3 + 200 / 50), "random weights: tokens without text"
    assert tuner.reply_s({"decode_tok_s": None, "first_text_ms": None}) == float("inf")
    empty = Measured("llama.cpp q8_0", "llama.cpp", "q8_0", "measured", "passed", 1.0,
                     [Round(silent, {"decode_tok_s": None})])  # fmt: skip
    assert tuner.choose([empty]) is None


def test_skipped_candidates_are_never_chosen_and_none_measured_means_no_choice() -> None:
    broken = Measured("llama.cpp q4_k_m", "llama.cpp", "q4_k_m", "skipped: crashed with SIGILL during start-up")
    ok = measured("vllm-cpu bfloat16", (15, 250), (12, 400))
    assert tuner.choose([broken, ok]) is ok
    assert tuner.choose([broken]) is None
    assert tuner.choose([]) is None


def result(cfg: AppConfig, key: str, chosen: str | None = "llama.cpp q8_0") -> TuneResult:
    m = [measured("llama.cpp q8_0", (60, 200), (30, 300)), Measured("vllm-cpu bfloat16", "vllm-cpu", "bfloat16",
         "skipped: not ready (failed)")]  # fmt: skip
    return TuneResult(key, "AMD EPYC [abc]", cfg.tune.users, chosen, tuner.RULE, 42.0, "2026-12-02T05:00:00", m)


def test_a_kept_result_reads_back_whole_and_a_broken_file_is_measured_again(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    assert kept.load(cfg, "k1") is None
    path = kept.save(cfg, result(cfg, "k1"))
    back = kept.load(cfg, "k1")
    assert back == result(cfg, "k1") and path.parent == cfg.paths.cache / "tune"
    summary = back.summary()
    assert summary["chosen"] == "llama.cpp q8_0" and summary["decode_tok_s_1_user"] == 60
    assert summary["figures"]["vllm-cpu bfloat16"] == {"outcome": "skipped: not ready (failed)"}
    json.loads(path.read_text())  # plain JSON a person can read
    path.write_text("{not json")
    assert kept.load(cfg, "k1") is None


def test_the_key_changes_with_the_cpu_the_builds_the_model_the_settings_and_the_candidates(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    two = ["llama.cpp q4_1", "vllm-cpu bfloat16"]
    base = kept.tune_key(cfg, "AMD EPYC [1]", ["b1"], "m", two)
    assert base == kept.tune_key(cfg, "AMD EPYC [1]", ["b1"], "m", two)
    others = {
        kept.tune_key(cfg, "Intel Xeon [2]", ["b1"], "m", two),
        kept.tune_key(cfg, "AMD EPYC [1]", ["b2"], "m", two),
        kept.tune_key(cfg, "AMD EPYC [1]", ["b1"], "other model", two),
        kept.tune_key(config(tmp_path, tune__users=8), "AMD EPYC [1]", ["b1"], "m", two),
        kept.tune_key(config(tmp_path, tune__formats="[q8_0]"), "AMD EPYC [1]", ["b1"], "m", two),
        kept.tune_key(cfg, "AMD EPYC [1]", ["b1"], "m", [*two, "vllm-cpu float32"]),  # a candidate more: again
        kept.tune_key(config(tmp_path, tune__places="false"), "AMD EPYC [1]", ["b1"], "m", two),
        kept.tune_key(config(tmp_path, llamacpp__parallel=4), "AMD EPYC [1]", ["b1"], "m", two),  # the most measured
        kept.tune_key(config(tmp_path, engine__flags__max_num_seqs=4), "AMD EPYC [1]", ["b1"], "m", two),
    }
    assert base not in others and len(others) == 9


def test_only_what_is_left_on_auto_is_measured(tmp_path: Path, bf16_cpu: None) -> None:
    assert tunable(config(tmp_path))
    assert tunable(config(tmp_path, engine__name="llama.cpp")), "llama.cpp's format on auto"
    assert not tunable(config(tmp_path, engine__name="llama.cpp", llamacpp__quantization="q4_k_m"))
    assert not tunable(config(tmp_path, engine__name="vllm-cpu")), "vllm-cpu's dtype is tuned only without bf16"


def test_llama_cpp_is_measured_in_each_allowed_format_and_a_shipped_gguf_in_its_own(
    tmp_path: Path, bf16_cpu: None
) -> None:
    folder = ResolvedModel(str(tmp_path / "ernie"))
    ll: Engine = engine("llama.cpp")
    assert ll.tune_formats(config(tmp_path), folder, sys.executable) == ["q8_0", "q4_k_m"]
    assert ll.tune_formats(config(tmp_path, tune__formats="[bf16]"), folder, sys.executable) == ["bf16"]
    assert ll.tune_formats(config(tmp_path, llamacpp__quantization="q4_k_m"), folder, sys.executable) == ["q4_k_m"]
    gguf = tmp_path / "x.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    assert ll.tune_formats(config(tmp_path, llamacpp__gguf=gguf), folder, sys.executable) == ["q4_1"]
    assert engine("vllm-cpu").tune_formats(config(tmp_path), folder, sys.executable) == ["bfloat16"]
    chosen = ll.in_format(config(tmp_path), "q4_k_m")
    assert chosen.llamacpp.quantization == "q4_k_m"
    pinned = config(tmp_path, llamacpp__quantization="bf16")
    assert ll.in_format(pinned, "q4_k_m").llamacpp.quantization == "bf16", "a format the user set is kept"


AMX = {"avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512vbmi",
       "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8"}  # fmt: skip


def test_llama_cpp_s_two_best_kernel_builds_are_measured_in_each_format_unless_one_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = fake_install(tmp_path / "ll", ["x64", "haswell", "skylakex", "zen4", "sapphirerapids"])
    monkeypatch.setattr("backend.engines.llamacpp.cpu_flags", lambda: AMX)  # an Intel Xeon with AMX
    cfg = config(tmp_path, llamacpp__prefix=prefix, tune__kernel_builds=2)
    ll: Engine = engine("llama.cpp")
    assert ll.tune_builds(cfg) == ["sapphirerapids", "zen4"]
    assert ll.tune_builds(config(tmp_path, llamacpp__prefix=prefix)) == [""], "by default the best claimed alone"
    assert ll.tune_builds(config(tmp_path, llamacpp__prefix=prefix, tune__kernel_builds=3)) == [
        "sapphirerapids", "zen4", "skylakex"]  # fmt: skip
    assert ll.tune_builds(config(tmp_path, llamacpp__prefix=prefix, tune__kernel_builds=1)) == [""], "the canary's"
    named = config(tmp_path, llamacpp__prefix=prefix, tune__kernel_builds=2, llamacpp__cpu_variant="zen4")
    assert ll.tune_builds(named) == [""], "a variant the user named is kept"
    monkeypatch.setattr("backend.engines.llamacpp.cpu_flags", lambda: {"avx", "avx2", "fma", "f16c", "bmi2"})
    assert ll.tune_builds(cfg) == [""], "AVX2 only: haswell, and x64 is never measured: nothing to compare"
    monkeypatch.setattr("backend.engines.llamacpp.cpu_flags", lambda: AMX)
    # the candidates: each format with its builds best first, then vllm-cpu (the default order)
    folder = ResolvedModel(str(tmp_path / "ernie"))
    monkeypatch.setattr(tuner, "cpu_engines", lambda cfg, python: [ll, engine("vllm-cpu")])
    monkeypatch.setattr("backend.engines.vllm.cpu_flags", lambda: AMX)
    assert [c.label for c in tuner.candidates(cfg, sys.executable, folder)] == [
        "llama.cpp q8_0 sapphirerapids", "llama.cpp q8_0 zen4", "llama.cpp q4_k_m sapphirerapids",
        "llama.cpp q4_k_m zen4", "vllm-cpu bfloat16"]  # fmt: skip
    one = tuner.candidate_config(cfg, tuner.Contender(ll, "q4_k_m", "zen4"), tmp_path / "t")
    assert (one.llamacpp.quantization, one.llamacpp.cpu_variant) == ("q4_k_m", "zen4")
    assert [c.variant for c in ll.candidates(one, ll.flags(one, effective_flags(one, "cpu")))] == ["zen4"]
    assert ll.in_build(cfg, "") == cfg
    # a named engine and format with two builds to compare: the tune measures them
    fixed = {"llamacpp__prefix": prefix, "engine__name": "llama.cpp", "llamacpp__quantization": "q8_0"}
    assert tunable(config(tmp_path, **fixed, tune__kernel_builds=2))
    assert not tunable(config(tmp_path, **fixed, tune__kernel_builds=2, llamacpp__cpu_variant="zen4"))
    assert not tunable(config(tmp_path, **fixed)), "one build by default: nothing to measure"


def test_the_quicker_kernel_build_is_served_and_a_tie_keeps_the_best_claimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ll = engine("llama.cpp")
    amx, zen4 = tuner.Contender(ll, "q4_k_m", "sapphirerapids"), tuner.Contender(ll, "q4_k_m", "zen4")
    script = Figures({amx.label: ((24.5, 200), (20, 300)), zen4.label: ((33.0, 200), (28, 300))})
    script.install(monkeypatch, tmp_path, [amx, zen4])
    cfg = config(tmp_path)
    result = asyncio.run(tuner.tune(cfg, sys.executable, lambda _: None))
    assert result is not None and result.chosen == "llama.cpp q4_k_m zen4"
    assert [m.build for m in result.measured] == ["sapphirerapids", "zen4"]
    assert kept.load(cfg, result.key) == result, "the build is kept with the choice"
    choice = tuner.applied(cfg, result)
    assert choice is not None and (choice.cfg.llamacpp.quantization, choice.cfg.llamacpp.cpu_variant) == (
        "q4_k_m", "zen4")  # fmt: skip
    # within the margin: the default order, the best build the CPU claims
    script.figures[zen4.label] = ((26.0, 200), (21, 300))
    tied = asyncio.run(tuner.tune(cfg, sys.executable, lambda _: None, force=True))
    assert tied is not None and tied.chosen == "llama.cpp q4_k_m sapphirerapids" and "default order" in tied.reason


@pytest.fixture
def bf16_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU with bfloat16 instructions (AMD Zen 4): vllm-cpu's dtype is the profile's."""
    monkeypatch.setattr("backend.engines.vllm.cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})


def test_vllm_cpu_is_measured_in_float32_too_where_the_cpu_has_no_bfloat16_instructions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("backend.engines.vllm.cpu_flags", lambda: {"avx", "avx2", "fma"})  # AMD Zen 3
    folder = ResolvedModel(str(tmp_path / "ernie"))
    vc: Engine = engine("vllm-cpu")
    cfg = config(tmp_path)
    assert vc.tune_formats(cfg, folder, sys.executable) == ["bfloat16", "float32"]
    assert tunable(config(tmp_path, engine__name="vllm-cpu")), "the dtype is left to the tune"
    chosen = vc.in_format(cfg, "float32")
    assert chosen.engine.flags.dtype == "float32"
    served, profile = effective_flags(chosen, "cpu"), chosen.profiles["cpu"]
    assert served.dtype == "float32"
    assert (served.cpu_kvcache_space_gib, served.max_num_seqs, served.enforce_eager) == (
        profile.cpu_kvcache_space_gib,
        profile.max_num_seqs,
        profile.enforce_eager,
    ), "the profile's other flags stay (without its KV space vllm-cpu wants 92 % of the memory free)"
    assert [c.variant for c in vc.candidates(chosen, served)] == ["float32"]
    assert vc.in_format(cfg, "bfloat16") == cfg, "bfloat16: the profile's own, float32 still behind it"
    assert [c.variant for c in vc.candidates(cfg, effective_flags(cfg, "cpu"))] == ["bfloat16", "float32"]
    pinned = config(tmp_path, engine__flags__dtype="bfloat16")
    assert vc.tune_formats(pinned, folder, sys.executable) == ["bfloat16"]
    assert vc.in_format(pinned, "float32").engine.flags.dtype == "bfloat16", "a dtype the user set is kept"
    assert not tunable(config(tmp_path, engine__name="vllm-cpu", engine__flags__dtype="bfloat16"))


def test_each_candidate_runs_alone_on_a_free_port_with_its_own_log(tmp_path: Path) -> None:
    cfg = config(tmp_path, server__port=8100, server__api_key="secret")
    one = tuner.candidate_config(cfg, tuner.Contender(engine("llama.cpp"), "q4_k_m"), tmp_path / "t")
    assert (one.engine.name, one.llamacpp.quantization, one.server.port, one.server.api_key) == (
        "llama.cpp", "q4_k_m", 0, None)  # fmt: skip
    assert one.paths.data == tmp_path / "t" and one.paths.cache == cfg.paths.cache, "verdicts and models shared"


def test_the_starting_notice_shows_the_tune_progress_in_the_users_language() -> None:
    step = Phrase("tune.measuring", candidate="llama.cpp q8_0", number=2, total=3)
    en = wait_text(EngineWait("starting", 12.0, progress=step), "en-US")
    zh = wait_text(EngineWait("starting", 12.0, progress=step), "zh-CN")
    assert "llama.cpp q8_0, 2 of 3" in en and "starting" in en
    assert "llama.cpp q8_0（第 2 个，共 3 个）" in zh
    # the tune's step is a line of its own below the plain notice, which a start without a tune shows alone
    plain = wait_text(EngineWait("starting", 12.0), "en-US")
    assert plain == t("starting", "en-US", elapsed=12.0)
    assert en == f"{plain}\n\n🔎 {step.text('en-US')}"
    first_page = serving_status(Serving("ERNIE-4.5-0.3B-PT", "", "", "starting", 12.0, progress=step), "zh-CN")
    assert first_page["state"].startswith("正在启动") and "（第 2 个，共 3 个）" in first_page["state"]


class Figures:
    """Scripted measurements for the tune's own loop: each candidate's (1 user, N users) figures per call."""

    def __init__(
        self, figures: dict[str, tuple[tuple[float, float], tuple[float, float]]], busy: frozenset[str] = frozenset()
    ) -> None:
        self.figures = figures
        self.busy = busy  # candidates whose rounds other work disturbed
        self.started: list[str] = []
        self.rounds: list[str] = []
        self.stopped: list[str] = []
        self.places: list[str] = []  # the candidates whose places were measured
        self.stopped_before_places: list[str] = []

    def install(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pairs: list[tuner.Contender]) -> None:
        test = self

        class Stub:
            def __init__(self, label: str) -> None:
                self.label = label

            async def stop(self) -> None:
                test.stopped.append(self.label)

        async def start(cfg: AppConfig, contender: tuner.Contender, data: Path) -> tuner.Running | Measured:
            label = contender.label
            self.started.append(label)
            if label not in self.figures:
                return tuner.record(contender, "skipped: crashed with SIGILL during start-up")
            return tuner.Running(Stub(label), tuner.record(contender, "measured", "passed", 1.0))  # type: ignore[arg-type]

        async def measure_round(cfg: AppConfig, running: tuner.Running) -> Round:
            label = running.measured.label
            self.rounds.append(label)
            await asyncio.sleep(0.002)  # a round takes time
            one, many = self.figures[label]
            return Round(level(*one), level(*many), other=0.5 if label in self.busy else 0.0)

        async def measure_places(cfg: AppConfig, running: tuner.Running, progress: object) -> Places:
            self.places.append(running.measured.label)
            self.stopped_before_places = list(self.stopped)
            return Places(8, "scripted", {"4": [100.0], "8": [150.0]}, {"4": [25.0], "8": [19.0]}, 16)

        monkeypatch.setattr(tuner, "start", start)
        monkeypatch.setattr(tuner, "measure_round", measure_round)
        monkeypatch.setattr(tuner, "measure_places", measure_places)
        monkeypatch.setattr(tuner, "candidates", lambda cfg, python, model: pairs)
        monkeypatch.setattr(tuner, "model_of", lambda cfg, python: ResolvedModel(str(tmp_path / "m")))


Q8 = tuner.Contender(engine("llama.cpp"), "q8_0")
Q4 = tuner.Contender(engine("llama.cpp"), "q4_k_m")


def test_a_tune_that_measured_before_is_kept_and_force_measures_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config(tmp_path)
    script = Figures({"llama.cpp q8_0": ((50, 200), (30, 300)), "llama.cpp q4_k_m": ((80, 200), (40, 300))})
    script.install(monkeypatch, tmp_path, [Q8, Q4])
    steps: list[Phrase | None] = []
    first = asyncio.run(tuner.tune(cfg, sys.executable, steps.append))
    assert first is not None and first.chosen == "llama.cpp q4_k_m" and "every round" in first.reason
    assert script.started == ["llama.cpp q8_0", "llama.cpp q4_k_m"]
    assert script.rounds == ["llama.cpp q8_0", "llama.cpp q4_k_m"] * 3, "A B A B A B: the candidates take turns"
    assert sorted(script.stopped) == sorted(script.started), "every candidate is stopped"
    assert [(p.code, p.params) for p in steps if p][:3] == [
        ("tune.starting", {"candidate": "llama.cpp q8_0", "number": 1, "total": 2}),
        ("tune.starting", {"candidate": "llama.cpp q4_k_m", "number": 2, "total": 2}),
        ("tune.measuring", {"candidate": "llama.cpp q8_0", "number": 1, "total": 6}),
    ]
    again = asyncio.run(tuner.tune(cfg, sys.executable, steps.append))
    assert again == first and len(script.rounds) == 6, "kept: nothing measured again"
    forced = asyncio.run(tuner.tune(cfg, sys.executable, steps.append, force=True))
    assert forced is not None and len(script.rounds) == 12
    choice = tuner.applied(cfg, forced)
    assert choice is not None and choice.engine == "llama.cpp" and choice.cfg.llamacpp.quantization == "q4_k_m"
    assert script.places == ["llama.cpp q4_k_m"] * 2, "the chosen one's places, measured with it (twice: forced)"
    assert script.stopped_before_places[-1:] == ["llama.cpp q8_0"], "the other one stopped before the places"
    assert choice.cfg.llamacpp.parallel == 8 and forced.places is not None and forced.places.chosen == 8
    assert "Replies at once: 8: scripted." in tuner.describe(forced)
    assert choice.summary["places"]["levels"]["8"] == {
        "total_tok_s": 150.0, "total_tok_s_range": [150.0, 150.0], "per_reply_tok_s": 19.0
    }  # fmt: skip
    assert kept.load(cfg, forced.key) == forced, "the places are kept with the choice"
    assert "typical reply" in tuner.describe(forced) and "(" in tuner.describe(forced), "figures with their spread"


def test_with_the_tune_off_a_kept_choice_stands_and_nothing_is_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Figures({"llama.cpp q4_k_m": ((60, 200), (30, 300))})
    script.install(monkeypatch, tmp_path, [Q4])
    off = config(tmp_path, tune__enabled="false")
    assert asyncio.run(tuner.first_start_choice(off, lambda _: None)) is None and script.rounds == []
    asyncio.run(tuner.tune(config(tmp_path), sys.executable, lambda _: None))  # `python -m backend tune`, say
    choice = asyncio.run(tuner.first_start_choice(off, lambda _: None))
    assert choice is not None and choice.cfg.llamacpp.quantization == "q4_k_m" and len(script.rounds) == 3


def test_past_the_budget_no_further_round_starts_and_the_rounds_measured_decide(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Figures({"llama.cpp q8_0": ((50, 200), (30, 300)), "llama.cpp q4_k_m": ((80, 200), (40, 300))})
    script.install(monkeypatch, tmp_path, [Q8, Q4])
    done = asyncio.run(tuner.tune(config(tmp_path, tune__budget_s=0.0001), sys.executable, lambda _: None))
    assert done is not None and done.chosen == "llama.cpp q4_k_m"
    assert script.rounds == ["llama.cpp q8_0", "llama.cpp q4_k_m"], "one round, then the budget was spent"


VLLM = tuner.Contender(engine("vllm-cpu"), "bfloat16")
FIGURES = {
    "llama.cpp q8_0": ((50, 200), (30, 300)),  # a typical reply: 5.41 s
    "llama.cpp q4_k_m": ((55, 200), (32, 300)),  # 5.03 s
    "vllm-cpu bfloat16": ((20, 800), (15, 900)),  # 12.4 s: 2.5x as long as q4_k_m
}


def test_a_candidate_far_slower_in_a_round_measures_no_further_rounds_and_is_never_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Figures(FIGURES)
    script.install(monkeypatch, tmp_path, [Q8, Q4, VLLM])
    steps: list[Phrase | None] = []
    done = asyncio.run(tuner.tune(config(tmp_path), sys.executable, steps.append))
    assert done is not None
    close = ["llama.cpp q8_0", "llama.cpp q4_k_m"]
    assert script.rounds == [*close, "vllm-cpu bfloat16", *close, *close], "dropped after round 1; the close pair: 3"
    assert sorted(script.stopped) == sorted(script.started), "every candidate stopped once"
    assert script.stopped[0] == "vllm-cpu bfloat16", "the dropped one stopped before the later rounds"
    measuring = [(p.params["number"], p.params["total"]) for p in steps if p and p.code == "tune.measuring"]
    assert measuring == [(1, 9), (2, 9), (3, 9), (4, 7), (5, 7), (6, 7), (7, 7)], "the progress counts what is left"
    slow = done.measured[2]
    assert len(slow.rounds) == 1
    assert slow.dropped == "after round 1: a typical reply took 2.5x as long as llama.cpp q4_k_m's"
    assert done.chosen == "llama.cpp q8_0" and "default order" in done.reason, "the close pair: the default order"
    assert "dropped after round 1" in done.reason and "dropped after round 1" in tuner.describe(done)
    assert kept.figures(slow)["dropped"] == slow.dropped and "dropped" not in kept.figures(done.measured[0])
    again = kept.load(config(tmp_path), done.key)
    assert again is not None and again.measured[2].dropped == slow.dropped, "kept with the result"


def test_a_round_disturbed_by_other_work_drops_nothing_and_a_dropped_candidate_never_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Figures(FIGURES, busy=frozenset({"vllm-cpu bfloat16"}))
    script.install(monkeypatch, tmp_path, [Q8, Q4, VLLM])
    done = asyncio.run(tuner.tune(config(tmp_path), sys.executable, lambda _: None))
    assert done is not None and script.rounds.count("vllm-cpu bfloat16") == 3 and not done.measured[2].dropped
    # the only one left after the others were dropped: chosen, saying why
    fast = measured("llama.cpp q8_0", (60, 200), (30, 300))
    slow = measured("llama.cpp q4_k_m", (20, 900), (10, 900))
    tuner.drop_slow(0, [fast, slow])
    assert slow.dropped and not fast.dropped
    decision = tuner.decide([slow, fast])
    assert decision.chosen is fast and decision.reason.startswith("every other candidate took 1.5x as long")
    # a dropped candidate is not chosen even where its one round's score is the lowest median and it comes first
    lucky = measured("llama.cpp q4_k_m", (90, 100), (50, 200))
    lucky.dropped = "after round 2: a typical reply took 1.6x as long as llama.cpp q8_0's"
    assert tuner.decide([lucky, fast]).chosen is fast


def test_a_candidate_that_does_not_start_is_skipped_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Figures({"llama.cpp q4_k_m": ((80, 200), (40, 300))})
    script.install(monkeypatch, tmp_path, [Q8, Q4])
    done = asyncio.run(tuner.tune(config(tmp_path), sys.executable, lambda _: None))
    assert done is not None and done.chosen == "llama.cpp q4_k_m" and "only candidate" in done.reason
    assert done.measured[0].outcome == "skipped: crashed with SIGILL during start-up"
    assert "SIGILL" in tuner.describe(done)


def test_only_a_candidate_clearly_quicker_in_every_round_wins_else_the_default_order() -> None:
    # q8_0 first in the default order; q4_k_m's median 3 % quicker: not a gain the rounds can tell
    q8 = measured("llama.cpp q8_0", (60, 200), (30, 300), jitter=0.05)
    q4 = measured("llama.cpp q4_k_m", (62, 195), (31, 290), jitter=0.05)
    tie = tuner.decide([q8, q4])
    assert tie.chosen is q8 and "default order" in tie.reason and "llama.cpp q4_k_m" in tie.reason
    assert tuner.decide([q4, q8]).chosen is q4, "the order given is the default"
    # 30 % quicker in every round: it wins
    fast = measured("llama.cpp q4_k_m", (80, 150), (40, 220), jitter=0.05)
    clear = tuner.decide([q8, fast])
    assert clear.chosen is fast and "every round" in clear.reason
    # one round in which it was not (a busy machine that the re-measuring missed): no longer clear
    wild = measured("llama.cpp q4_k_m", (80, 150), (40, 220))
    wild.rounds[1] = Round(level(20, 2000), level(10, 3000))
    assert tuner.decide([q8, wild]).chosen is q8
    # quicker in every round, 25 % at the median, only 18 % in one round: it wins (a margin asked of every round lets
    # one round decide)
    near = measured("llama.cpp q4_k_m", (60, 200), (30, 300))
    near.rounds = [
        Round(level(r.one["decode_tok_s"]["p50"] / f, r.one["first_text_ms"]["p50"] * f),
              level(r.many["decode_tok_s"]["p50"] / f, r.many["first_text_ms"]["p50"] * f))
        for r, f in zip(q8.rounds, (0.75, 0.82, 0.72), strict=True)
    ]  # fmt: skip
    ratios = [tuner.round_score(a) / tuner.round_score(b) for a, b in zip(near.rounds, q8.rounds, strict=True)]
    assert ratios == pytest.approx([0.75, 0.82, 0.72])
    assert tuner.decide([q8, near]).chosen is near
    # the rounds are compared in pairs: a machine that slows down for a round slows both candidates of that round
    drifting_q8 = measured("llama.cpp q8_0", (60, 200), (30, 300))
    drifting_fast = measured("llama.cpp q4_k_m", (80, 150), (40, 220))
    for m in (drifting_q8, drifting_fast):
        m.rounds[2] = Round(
            level(m.rounds[2].one["decode_tok_s"]["p50"] / 2, m.rounds[2].one["first_text_ms"]["p50"] * 2),
            level(m.rounds[2].many["decode_tok_s"]["p50"] / 2, m.rounds[2].many["first_text_ms"]["p50"] * 2),
        )
    assert tuner.decide([drifting_q8, drifting_fast]).chosen is drifting_fast


def test_the_demo_keeps_one_key_before_and_after_its_folder_is_made(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    demo = ResolvedModel(str(tuner.demo_model_dir(cfg)), is_demo=True)
    pairs = [tuner.Contender(engine("llama.cpp"), "q4_1")]
    before = tuner.key_for(cfg, sys.executable, demo, pairs)
    folder = tuner.demo_model_dir(cfg)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert tuner.key_for(cfg, sys.executable, demo, pairs) == before
    others = (
        config(tmp_path, auth__enabled="true", api__enabled="true"),
        config(tmp_path, paths__data_dir=tmp_path / "d2"),
        config(tmp_path, server__port=9000),
    )
    for other in others:
        assert tuner.key_for(other, sys.executable, demo, pairs) == before, "nothing else enters"


def test_fewer_places_win_only_with_a_higher_total_in_every_round_by_the_margin() -> None:
    assert tuner.place_levels(4, 16) == [4, 8, 16] and tuner.place_levels(4, 6) == [4, 6]
    assert tuner.place_levels(4, 2) == [2], "never more than the engine is configured for"
    # the totals alike: the most places stay (every chat starts at once)
    chosen, why = tuner.decide_places({4: [100, 110, 95], 8: [130, 145, 125], 16: [135, 150, 120]}, 16)
    assert chosen == 16 and "fewer at once gave no total at least 20% higher in every round" in why
    assert "8 at once 130 (125-145)" in why
    # 8 at once: more in total than 16 in every round by a third (as where 16 slots re-read the weights per row)
    chosen, why = tuner.decide_places({4: [100, 100, 100], 8: [140, 150, 145], 16: [100, 110, 105]}, 16)
    assert chosen == 8 and why.startswith("more at once gave at least 20% less in total in every round")
    # higher at the median, but not in one round: not beyond the spread
    assert tuner.decide_places({4: [100, 100, 100], 8: [105, 104, 110], 16: [150, 99, 160]}, 16)[0] == 16
    assert tuner.decide_places({4: [200, 210], 8: [150, 160], 16: [100, 100]}, 16) == (
        4, "more at once gave at least 20% less in total in every round (tokens a second in total, median (min-max) "
        "over the rounds: 4 at once 205 (200-210), 8 at once 155 (150-160), 16 at once 100 (100-100))"
    )  # fmt: skip
    assert tuner.decide_places({2: [50.0]}, 2) == (2, "as configured (2): fewer than two levels to compare")


def test_the_places_levels_take_turns_and_a_disturbed_level_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    measured_at: list[int] = []

    async def measure_level(
        running: object, users: int, turns: int, shape: object
    ) -> tuple[dict[str, Any], float, int]:
        measured_at.append(users)
        assert turns == users * tuner.PLACES_SHAPE.turns and shape is tuner.PLACES_SHAPE
        total = {2: 60.0, 4: 100.0, 8: 104.0}[users]
        return {"output_tok_s": total, "decode_tok_s": {"p50": total / users}}, 0.4 if users == 8 else 0.0, 0

    class Spec:
        capacity = 8

    class Supervisor:
        spec = Spec()

    monkeypatch.setattr(tuner, "measure_level", measure_level)
    steps: list[Phrase | None] = []
    running = tuner.Running(Supervisor(), Measured("llama.cpp q4_1", "llama.cpp", "q4_1", "measured"))  # type: ignore[arg-type]
    cfg = load_config(environ={"ERNIE_TUNE__USERS": "2"})
    places = asyncio.run(tuner.measure_places(cfg, running, steps.append))
    assert measured_at == [2, 4, 8, 8, 4, 2, 2, 4, 8], "A B C, C B A, A B C: the levels take turns"
    assert places is not None and places.chosen == 8 and places.configured == 8 and places.disturbed == 3
    assert places.totals == {"2": [60.0] * 3, "4": [100.0] * 3, "8": [104.0] * 3}
    assert [(p.params["users"], p.params["number"]) for p in steps if p][:4] == [(2, 1), (4, 2), (8, 3), (8, 4)]
    assert all(p is not None and p.params["total"] == 9 for p in steps)
    zh = Phrase("tune.places", users=4, number=2, total=9).text("zh-CN")
    assert "4 条同时进行" in zh and "（第 2 个，共 9 个）" in zh


def test_the_engines_run_the_measured_places_and_the_doctor_says_so(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    assert engine("llama.cpp").with_places(cfg, 6).llamacpp.parallel == 6
    vllm_cfg = engine("vllm-cpu").with_places(cfg, 6)
    assert effective_flags(vllm_cfg, "cpu").max_num_seqs == 6, "over the CPU profile's own 16"
    places = Places(8, "why", {"4": [100.0, 90.0], "8": [150.0, 140.0]}, {"4": [25.0, 22.0], "8": [19.0, 18.0]}, 16)
    text = places_text(places.summary())
    assert text == (
        "; replies at once measured best at 8 (4 at once 95.0 tok/s in total (23.5 per reply), "
        "8 at once 145.0 tok/s in total (18.5 per reply))"
    )
    won = {"decode_tok_s_1": 130, "first_text_ms_1": 80, "decode_tok_s_n": 30}
    tune = {"chosen": "llama.cpp q4_1", "when": "now", "seconds": 90, "users": 4, "places": places.summary(),
            "figures": {"llama.cpp q4_1": won}}  # fmt: skip
    assert tune_line(tune).endswith(text) and places_text(None) == ""
