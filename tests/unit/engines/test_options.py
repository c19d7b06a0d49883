"""Engine flags checked against the REAL installed vLLM's argument parser (read once, cached per version)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from backend.config import ROOT, AppConfig, EngineFlags, load_config
from backend.engines.options import EngineOptions, OptionsUnavailableError, check_args, read_options
from backend.engines.trtllm import TRTLLM_PARSER
from backend.engines.vllm import VLLM_PARSER
from backend.errors import ConfigError, Phrase
from backend.serving.preflight import check_flags, check_flags_command
from backend.serving.profiles import effective_flags
from tests.installed import need_vllm
from tests.launching import failed_start, launch

pytestmark = pytest.mark.slow  # the first run imports vLLM (10-20 s); later runs read the cache

OPTIONS_CACHE = ROOT / ".cache" / "test-engine-options"
CFG = load_config(environ={})


@pytest.fixture(scope="session")
def vllm_options(engine_py: str) -> EngineOptions:
    need_vllm()
    options = read_options(VLLM_PARSER, engine_py, OPTIONS_CACHE)
    assert options.version and "--max-model-len" in options.options
    return options


def launch_args(cfg: AppConfig, profile: str, engine_py: str, flags: EngineFlags | None = None) -> list[str]:
    engine = "vllm-cpu" if profile == "cpu" else "vllm"
    spec = launch(
        cfg, engine, "/models/ernie", 8100, "key", python=engine_py, flags=flags or effective_flags(cfg, profile)
    )
    return spec.args


def test_options_are_cached_per_version(vllm_options: EngineOptions, engine_py: str) -> None:
    files = list((OPTIONS_CACHE / "engine-options").glob(f"vllm-{vllm_options.version}-*.json"))
    assert files, "the options were not cached"
    assert read_options(VLLM_PARSER, engine_py, OPTIONS_CACHE) is vllm_options  # and kept in memory


def test_engine_without_the_package(engine_py: str, tmp_path: Path) -> None:
    with pytest.raises(OptionsUnavailableError, match="tensorrt_llm is not installed"):
        read_options(TRTLLM_PARSER, engine_py, tmp_path)


def said(problems: list[Phrase]) -> list[str]:
    """The problems as the English log and messages say them."""
    return [str(problem) for problem in problems]


@pytest.mark.parametrize("profile", sorted(CFG.profiles))
def test_every_configured_profile_passes_the_real_parser(
    profile: str, vllm_options: EngineOptions, engine_py: str
) -> None:
    assert check_args(launch_args(CFG, profile, engine_py), vllm_options) == []


def test_cpu_profile_flags_pass(vllm_options: EngineOptions, engine_py: str) -> None:
    args = launch_args(CFG, "cpu", engine_py)
    assert "--enforce-eager" in args and args[args.index("--block-size") + 1] == "32"
    assert "--gpu-memory-utilization" not in args  # a GPU-only flag the cpu engine leaves out
    assert check_args(args, vllm_options) == []


INVENTED = [
    ("--enable-tensorrt-llm", [], "engine.name: trtllm"),
    ("--tensorrt-llm-model-dir", ["/engines/ernie"], "trtllm.engine_dir"),
    ("--config-path", ["ernie.yaml"], "Did you mean --config? vLLM's --config takes a YAML file"),
    (
        "--awq-ckpt-path",
        ["/models/ernie-awq"],
        "Did you mean --quantization? vLLM reads AWQ weights from the model folder",
    ),
    ("--swap-space", ["4"], "Did you mean --kv-offloading-size? vLLM's V1 engine removed swap space"),
]


@pytest.mark.parametrize(("flag", "values", "suggestion"), INVENTED)
def test_invented_flags_are_refused_with_a_suggestion(
    flag: str, values: list[str], suggestion: str, vllm_options: EngineOptions
) -> None:
    problems = said(
        check_args([flag, *values, "--max-model-len", "2048"], vllm_options, lambda f: "engine.flags.extra_args")
    )
    assert len(problems) == 1
    assert problems[0].startswith(f"engine.flags.extra_args: vLLM {vllm_options.version} has no flag {flag}.")
    assert suggestion in problems[0]


def test_misspelt_flag_gets_the_closest_real_one(vllm_options: EngineOptions) -> None:
    assert said(check_args(["--max-model-length", "2048"], vllm_options)) == [
        f"vLLM {vllm_options.version} has no flag --max-model-length. Did you mean --max-model-len?"
    ]
    assert "Did you mean --gpu-memory-utilization?" in str(check_args(["--gpu-memory-util", "0.5"], vllm_options)[0])


def test_vllm_spellings_that_are_fine(vllm_options: EngineOptions) -> None:
    ok = [
        "--max_model_len",
        "2048",  # underscores: FlexibleArgumentParser accepts them
        "--max-num-seqs=8",
        "--compilation-config.mode",
        "3",  # a field of a JSON flag
        "-O3",
        "-tp",
        "1",
        "--no-enable-prefix-caching",
        "--dtype",
        "half",
        "--quantization",
        "awq",
    ]
    assert check_args(ok, vllm_options) == []


def test_values_and_switches(vllm_options: EngineOptions) -> None:
    found = check_args(
        ["--enforce-eager", "true", "--dtype", "bf16", "--quantization", "awq4", "--max-model-len"], vllm_options
    )
    problems = said(found)
    assert problems[0] == "'true' follows --enforce-eager, a switch that takes no value."
    assert problems[1].startswith("--dtype 'bf16' is not one of") and problems[1].endswith("Did you mean bfloat16?")
    assert problems[2].startswith("--quantization 'awq4' is not one of") and "Did you mean awq?" in problems[2]
    assert problems[3] == "--max-model-len needs a value."
    assert [p.text("zh-CN") for p in found[::3]] == [
        "'true' 跟在不带值的开关 --enforce-eager之后。",
        "--max-model-len 需要一个值。",
    ]
    assert said(check_args(["--enforce-eager=1"], vllm_options)) == [
        "--enforce-eager is a switch and takes no value (got '--enforce-eager=1')."
    ]


PARSE_WITH_VLLM = r"""
import json, sys
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser
results = []
for args in json.loads(sys.argv[1]):
    try:
        make_arg_parser(FlexibleArgumentParser()).parse_args(args)
        results.append(True)
    except SystemExit:
        results.append(False)
print("@@RESULTS@@" + json.dumps(results))
"""


def test_checks_agree_with_vllm_parsing_the_same_arguments(vllm_options: EngineOptions, engine_py: str) -> None:
    base = ["--model", "/models/ernie"]
    cases = [
        launch_args(CFG, "cpu", engine_py),
        launch_args(CFG, "h200", engine_py),
        [*base, "--max_model_len", "2048", "-O3", "--compilation-config.mode", "3"],
        [*base, "--dtype", "bf16"],
        [*base, "--max-model-length", "2048"],
        *([*base, flag, *values] for flag, values, _ in INVENTED),
    ]
    proc = subprocess.run(
        [engine_py, "-c", PARSE_WITH_VLLM, json.dumps(cases)], capture_output=True, text=True, timeout=300
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("@@RESULTS@@"))
    vllm_accepts = json.loads(line.removeprefix("@@RESULTS@@"))
    we_accept = [not check_args(args, vllm_options) for args in cases]
    assert we_accept == vllm_accepts
    assert we_accept[:3] == [True, True, True]


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ({"engine__flags__extra_args": '["--swap-space", "4"]'}, "engine.flags.extra_args"),
        ({"profiles__cpu__extra_args": '["--swap-space", "4"]'}, "profiles.cpu.extra_args"),
    ],
)
def test_check_flags_names_the_config_key(
    override: dict[str, str],
    key: str,
    vllm_options: EngineOptions,
    make_config: Callable[..., AppConfig],
    engine_py: str,
) -> None:
    cfg = make_config(**override)
    spec = launch(cfg, "vllm-cpu", "/m", 8100, "key", python=engine_py, flags=effective_flags(cfg, "cpu"))
    with pytest.raises(ConfigError) as info:
        check_flags(cfg, spec, vllm_options, "cpu")
    text = str(info.value)
    assert f"1 engine flag problem(s): {key}: vLLM {vllm_options.version} has no flag --swap-space." in text
    assert "check-flags --list" in text


async def test_bad_flag_stops_the_start_before_any_child(
    tmp_path: Path, make_config: Callable[..., AppConfig], vllm_options: EngineOptions
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"architectures": ["Ernie4_5ForCausalLM"], "num_attention_heads": 16})
    )
    cfg = make_config(
        model__id=str(model),
        engine__name="vllm-cpu",
        engine__flags__extra_args='["--enable-tensorrt-llm"]',
        paths__cache_dir=str(OPTIONS_CACHE),
        restart__max_attempts=1,
    )
    status = await failed_start(cfg)
    assert "vLLM" in (status.error or "") and "has no flag --enable-tensorrt-llm" in (status.error or "")
    assert "engine.name: trtllm" in (status.error or "")
    assert status.pid is None and not cfg.paths.engine_log.exists()  # nothing was spawned


@pytest.mark.parametrize(
    ("profile", "said"),
    [
        ("auto", "Detected profile: cpu (engine vllm-cpu runs on the CPU)"),
        ("cpu", "Profile: cpu (set by engine.profile)"),
    ],
)
def test_check_flags_says_where_the_profile_came_from(
    profile: str, said: str, make_config: Callable[..., AppConfig], engine_py: str, capsys: pytest.CaptureFixture[str]
) -> None:
    need_vllm()  # the flags are checked against the installed vLLM's own parser
    cfg = make_config(
        engine__name="vllm-cpu", engine__python=engine_py, engine__profile=profile, paths__cache_dir=str(OPTIONS_CACHE)
    )
    assert check_flags_command(cfg) == 0
    out = capsys.readouterr().out
    assert said in out and "profile cpu (vllm-cpu): OK" in out
