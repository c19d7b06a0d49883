"""The API key stays out of the recorded command line and of every results file."""

from __future__ import annotations

import pytest

from backend.benchmarks.redact import masked_argv, masked_command, scrub

KEY = "sk-local-K7W4h2T8Oi-XzGrzT5SNWuEWO08uQfUt"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--api-key", KEY, "--model", "m"], ["--api-key", "***", "--model", "m"]),
        ([f"--api-key={KEY}", "--model", "m"], ["--api-key=***", "--model", "m"]),
        (["--api-k", KEY], ["--api-k", "***"]),  # argparse takes an unambiguous prefix of the option
        (["--api", KEY, "--app-concurrency", "8"], ["--api", "***", "--app-concurrency", "8"]),
        (["--model", "--api-key-like"], ["--model", "--api-key-like"]),  # another word, not the option
        (["--api-key"], ["--api-key"]),  # no value given: nothing to hide
    ],
    ids=["separate", "equals", "prefix", "short prefix", "not the option", "no value"],
)
def test_the_key_is_masked_in_the_command_line(argv: list[str], expected: list[str]) -> None:
    assert masked_argv(argv) == expected


def test_the_recorded_command_reads_as_a_shell_would_take_it() -> None:
    argv = ["--api-key", KEY, "--name", "two words", "--out-dir=/tmp/x"]
    assert masked_command(argv) == "--api-key *** --name 'two words' --out-dir=/tmp/x"
    assert masked_command([f"--api-key={KEY}"]) == "--api-key=***"


def test_every_string_of_the_results_loses_the_key() -> None:
    doc = {
        "command": f"python -m backend bench --api-key {KEY}",
        "runs": [{"error_samples": [f"HTTP 401: key {KEY} refused"], "errors": 1, KEY: "as a key"}],
        "settings": {"temperature": 0.7, "empty": None},
    }
    clean = scrub(doc, [KEY, None, ""])
    assert KEY not in repr(clean)
    assert clean["command"] == "python -m backend bench --api-key ***"
    assert clean["runs"][0]["error_samples"] == ["HTTP 401: key *** refused"] and clean["runs"][0]["***"] == "as a key"
    assert clean["settings"] == {"temperature": 0.7, "empty": None} and doc["command"].endswith(KEY), "a copy"


def test_placeholders_are_no_secrets() -> None:
    doc = {"server": {"model": "EMPTY model", "note": "test"}}
    assert scrub(doc, ["EMPTY", "test"]) == doc, "short values would blank ordinary words"
