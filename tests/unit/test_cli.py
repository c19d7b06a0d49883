"""`python -m backend`: one parser; --help everywhere without work; each command's options reach its function."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from backend import cli
from backend.config import ROOT, AppConfig, load_config
from backend.engines.base import Api, engine_python
from backend.engines.registry import gguf_quantizer
from backend.ops.doctor import locate
from tests.conftest import MakeConfig

COMMANDS = [
    "check-prompts",
    "check-config",
    "loadtest",
    "prepare-model",
    "stop-engine",
    "tune",
    "check-flags",
    "build-trt-engine",
    "bench",
    "report",
    "check-answers",
    "doctor",
    "convert-gguf",
    "api-key",
    "link-account",
    "add-user",
]
# The function each command hands its work to (patched in cli's namespace, where it is called).
WORKERS = {
    "check-prompts": "check_folder",
    "check-config": "print_config",
    "loadtest": "loadtest_command",
    "prepare-model": "prepare_model_command",
    "stop-engine": "stop_command",
    "tune": "tune_command",
    "check-flags": "check_flags_command",
    "build-trt-engine": "build_prebuilt",
    "bench": "bench_command",
    "report": "report_command",
    "check-answers": "check_answers_command",
    "doctor": "doctor_command",
    "convert-gguf": "convert_gguf_command",
    "api-key": "api_key_command",
    "link-account": "link_account_command",
    "add-user": "add_user_command",
}


def test_every_command_is_in_the_parser() -> None:
    parser = cli.build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(sub.choices) == COMMANDS == list(WORKERS)


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> dict[str, mock.MagicMock]:
    """Every step that does work, replaced by a mock that fails the test when called."""
    names = ["load_config", "engine_python", "detect_gpus", "setup_logging", *WORKERS.values()]
    mocks = {name: mock.MagicMock(name=name, side_effect=AssertionError(f"{name} called")) for name in names}
    for name, fake in mocks.items():
        monkeypatch.setattr(cli, name, fake)
    return mocks


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_usage_and_does_nothing(
    command: str, flag: str, no_work: dict[str, mock.MagicMock], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main([command, flag])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m backend {command} "), out
    assert "--config FILE" in out
    assert not any(fake.called for fake in no_work.values())


def test_help_after_other_arguments_still_does_nothing(no_work: dict[str, mock.MagicMock]) -> None:
    for argv in (["check-config", "some.yaml", "--help"], ["build-trt-engine", "x", "-h"], ["add-user", "bob", "-h"]):
        with pytest.raises(SystemExit) as done:
            cli.main(argv)
        assert done.value.code == 0
    assert not any(fake.called for fake in no_work.values())


def test_top_level_help_and_no_arguments_list_the_commands(
    no_work: dict[str, mock.MagicMock], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([]) == 0
    listing = capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out == listing
    assert listing.startswith("usage: python -m backend ")
    for command in COMMANDS:
        assert re.search(rf"^ +{re.escape(command)}\b", listing, re.M), command
    assert not any(fake.called for fake in no_work.values())


def test_unknown_command_and_bad_option_exit_2(
    no_work: dict[str, mock.MagicMock], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = (["loadtest", "--sessions", "many"], ["loadtest", "--sessions", "0"], ["loadtest", "--chats", "old"])
    for argv in (["no-such-command"], ["doctor", "--no-such-option"], *bad):
        with pytest.raises(SystemExit) as done:
            cli.main(argv)
        assert done.value.code == 2
    assert "invalid choice: 'no-such-command'" in capsys.readouterr().err
    assert not any(fake.called for fake in no_work.values())


def _run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "backend", *argv],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_help_as_a_process_reads_no_configuration() -> None:
    """The commands that took --help for a file, a flag to act on, or nothing: a missing ERNIE_CONFIG is fine."""
    missing = str(ROOT / "no-such-config.yaml")
    commands = ("check-config", "build-trt-engine", "prepare-model", "check-flags", "doctor")
    with ThreadPoolExecutor(len(commands)) as pool:  # at once: each process takes seconds to import the app
        runs = list(pool.map(lambda command: _run(command, "--help", ERNIE_CONFIG=missing), commands))
    for command, done in zip(commands, runs, strict=True):
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.startswith(f"usage: python -m backend {command}") and not done.stderr
    # and without --help the same variable is an error, reported in one place for every command
    done = _run("check-config", ERNIE_CONFIG=missing)
    assert done.returncode == 1
    message, hint = done.stderr.splitlines()  # the error's message, then its hint
    assert message == f"python -m backend check-config: Configuration file {missing} does not exist."
    assert hint.startswith("Check ERNIE_CONFIG")


def test_a_configuration_error_stops_every_command_with_its_message_and_hint(
    no_work: dict[str, mock.MagicMock],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("server:\n  port: lots\n")
    monkeypatch.setattr(cli, "load_config", load_config)  # the real one; nothing after it may run
    needs = {
        "check-prompts": [],
        "add-user": ["bob"],
        "api-key": ["list"],
        "link-account": ["carol", "--email", "carol@example.org"],
        "convert-gguf": [],
        "report": ["r.json"],
        "check-answers": ["ref.json"],
    }
    for command in COMMANDS:
        assert cli.main([command, *needs.get(command, []), "--config", str(bad)]) == 1
        err = capsys.readouterr().err.splitlines()
        assert err[0].startswith(f"python -m backend {command}: Invalid configuration in {bad}: server.port")
        assert err[1].startswith("Correct the value")
    assert not any(fake.called for fake in no_work.values())


# ----- each command's arguments reach its function --------------------------------------------------
@pytest.fixture
def cfg(monkeypatch: pytest.MonkeyPatch, make_config: MakeConfig) -> AppConfig:
    """The configuration cli reads (once per command), fixed for the test."""
    config = make_config()
    monkeypatch.setattr(cli, "load_config", mock.MagicMock(return_value=config))
    return config


def called(monkeypatch: pytest.MonkeyPatch, name: str, argv: list[str]) -> Any:
    """Run `python -m backend ARGV` with WORKERS' function `name` patched; return the one call it got."""
    worker = mock.MagicMock(return_value=0)
    monkeypatch.setattr(cli, name, worker)
    assert cli.main(argv) == 0
    worker.assert_called_once()
    return worker.call_args


def test_config_file_argument_reaches_load_config(cfg: AppConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "print_config", mock.MagicMock(return_value=0))
    for argv, path in (
        (["check-config"], None),
        (["check-config", "a.yaml"], "a.yaml"),
        (["check-config", "--config", "b.yaml"], "b.yaml"),
        (["doctor", "--config", "c.yaml", "--no-app"], "c.yaml"),
        (["bench", "--config", "d.yaml"], "d.yaml"),
    ):
        monkeypatch.setattr(cli, "doctor_command", mock.MagicMock(return_value=0))
        monkeypatch.setattr(cli, "bench_command", mock.MagicMock(return_value=0))
        cli.load_config.reset_mock()  # type: ignore[attr-defined]
        assert cli.main(argv) == 0
        cli.load_config.assert_called_once_with(path)  # type: ignore[attr-defined]


def test_check_prompts_and_check_config(cfg: AppConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    assert called(monkeypatch, "check_folder", ["check-prompts", "other"]) == mock.call("other")
    assert called(monkeypatch, "check_folder", ["check-prompts"]) == mock.call(cfg.paths.resolve(cfg.paths.prompts_dir))
    assert called(monkeypatch, "print_config", ["check-config"]) == mock.call(cfg)


def test_loadtest(cfg: AppConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["loadtest", "--url", "http://h:1", "--sessions", "3", "--duration", "2.5", "--max-tokens", "7"]
    argv += ["--app-pid", "42", "--out", "o"]
    expected = mock.call("http://h:1", [3], 2.5, 7, 42, Path("o"), ["growing"], 0)
    assert called(monkeypatch, "loadtest_command", argv) == expected
    defaults = mock.call(cfg.app.url, [64], 120, 48, None, Path("results/load"), ["growing"], 0)
    assert called(monkeypatch, "loadtest_command", ["loadtest"]) == defaults
    both = ["loadtest", "--sessions", "1,16,1", "--chats", "fresh,growing"]
    assert called(monkeypatch, "loadtest_command", both).args[1::5] == ([1, 16, 1], ["fresh", "growing"])


def test_prepare_model_and_convert_gguf(cfg: AppConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    python = engine_python(cfg)
    assert called(monkeypatch, "prepare_model_command", ["prepare-model"]) == mock.call(cfg, python)
    tool = gguf_quantizer(cfg)
    argv = ["convert-gguf", "some/folder", "--quant", "q4_k_m"]
    want = mock.call(cfg, python, tool, Path("some/folder"), "q4_k_m")
    assert called(monkeypatch, "convert_gguf_command", argv) == want
    assert called(monkeypatch, "convert_gguf_command", ["convert-gguf"]) == mock.call(cfg, python, tool, None, None)


def test_stop_engine(cfg: AppConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    assert called(monkeypatch, "stop_command", ["stop-engine"]) == mock.call(cfg)


def test_check_flags(cfg: AppConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = mock.call(cfg, list_only=False, all_profiles=False)
    assert called(monkeypatch, "check_flags_command", ["check-flags"]) == plain
    both = mock.call(cfg, list_only=True, all_profiles=True)
    assert called(monkeypatch, "check_flags_command", ["check-flags", "--list", "--all-profiles"]) == both


def test_build_trt_engine(cfg: AppConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "detect_gpus", lambda: [])
    call = called(monkeypatch, "build_prebuilt", ["build-trt-engine"])
    assert call.args[:2] == (cfg, engine_python(cfg)) and call.args[3] is None  # no GPU: no compute capability


def test_bench(cfg: AppConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "setup_logging", lambda: None)
    argv = ["--concurrency", "1,4", "--base-url", "http://h:1/v1", "--hf-threads", "1", "--no-progress"]
    call = called(monkeypatch, "bench_command", ["bench", *argv])
    got_cfg, args, given, python = call.args
    assert got_cfg is cfg and given == argv and python == engine_python(cfg)
    assert (args.concurrency, args.base_url, args.hf_threads, args.no_progress) == ("1,4", "http://h:1/v1", 1, True)
    assert (args.repeat, args.per_user, args.input_len, args.datasets, args.port) == (3, 4, 256, "synthetic,prompts", 0)


def test_doctor(cfg: AppConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["doctor", "--app-url", "http://a", "--engine-url", "http://e", "--log", "l.txt", "--no-app"]
    argv += ["--all-log", "--strict", "--timeout", "2"]
    want = mock.call(
        cfg,
        app_url="http://a",
        engine_url="http://e",
        log="l.txt",
        no_app=True,
        whole_log=True,
        strict=True,
        timeout_s=2,
    )
    assert called(monkeypatch, "doctor_command", argv) == want
    defaults = mock.call(
        cfg, app_url=None, engine_url=None, log=None, no_app=False, whole_log=False, strict=False, timeout_s=5.0
    )
    assert called(monkeypatch, "doctor_command", ["doctor"]) == defaults


def test_add_user(cfg: AppConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["add-user", "alice", "--file", "u.yaml", "--password-stdin", "--print", "--role", "editor"]
    want = mock.call(cfg, "alice", file=Path("u.yaml"), password_stdin=True, print_only=True, role="editor")
    assert called(monkeypatch, "add_user_command", argv) == want
    plain = mock.call(cfg, "bob", file=None, password_stdin=False, print_only=False, role=None)
    assert called(monkeypatch, "add_user_command", ["add-user", "bob"]) == plain


def test_report_and_check_answers(cfg: AppConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    assert called(monkeypatch, "report_command", ["report", "out/results.json"]) == mock.call(Path("out/results.json"))
    argv = ["check-answers", "ref.json", "--url", "http://e:1", "--key", "k", "--api", "llama.cpp", "--format", "q8_0"]
    want = mock.call("http://e:1", "k", cfg.model.served_name, Api.LLAMACPP, Path("ref.json"), "q8_0", 120.0)
    assert called(monkeypatch, "check_answers_command", argv) == want


# ----- the doctor finds the app where `make run` serves it -------------------------------------------
def test_doctor_looks_for_the_app_where_make_run_serves_it() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    port = re.search(r"^PORT \?= (\d+)$", makefile, re.M)
    assert port is not None, "the Makefile sets PORT"
    run = re.search(r"^run:.*\n\t(.+)$", makefile, re.M)
    assert run is not None and "chainlit run app.py" in run.group(1) and "--port $(PORT)" in run.group(1)
    assert re.search(r"^doctor:.*\n\tERNIE_APP__PORT=\$\(PORT\) ", makefile, re.M), "make doctor follows PORT"

    shipped = load_config(environ={})  # config/backend.yaml, no overrides
    assert shipped.app.port == int(port.group(1)) == AppConfig().app.port
    assert locate(shipped).app_url == f"http://127.0.0.1:{port.group(1)}"


def test_the_commands_load_without_the_chat_uis_packages() -> None:
    """`python -m backend bench` and the GPU scripts (scripts/gpu/gpu_tune.py) run where only an engine is installed:
    the Socket.IO client that only the `loadtest` command uses is imported when a chat socket is made."""
    code = "import sys; sys.modules['socketio'] = None; import backend.cli; backend.cli.build_parser()"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
