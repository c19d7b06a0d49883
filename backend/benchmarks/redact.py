"""The API key stays out of what a benchmark records: the command line as it was run, and every results file."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from typing import Any

KEY_OPTION = "--api-key"
KEY_ENV = "ERNIE_BENCH_API_KEY"  # the key without a command line (which other users can read in ps)
MASK = "***"
# Shorter values (vLLM's "EMPTY", a test key) are no secrets, and replacing them would blank ordinary words.
MIN_SECRET = 8


def _is_key_option(name: str) -> bool:
    # argparse takes any unambiguous prefix: --api, --api-k, ... (--ap would also be --app-concurrency)
    return name.startswith("--api") and KEY_OPTION.startswith(name)


def masked_argv(argv: Sequence[str]) -> list[str]:
    """`argv` with the value of --api-key (`--api-key K`, `--api-key=K`, or a prefix of the option) as ***."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        name, equals, _ = arg.partition("=")
        if hide_next:
            out.append(MASK)
            hide_next = False
        elif _is_key_option(name):
            out.append(f"{name}={MASK}" if equals else arg)
            hide_next = not equals
        else:
            out.append(arg)
    return out


def masked_command(argv: Sequence[str]) -> str:
    """The command line as a shell would take it, the key shown as *** (unquoted, to read as a placeholder)."""
    return " ".join(
        shown if shown != given else shlex.quote(given) for given, shown in zip(argv, masked_argv(argv), strict=True)
    )


def scrub(data: Any, secrets: Iterable[str | None]) -> Any:
    """A copy of JSON-like `data` with every occurrence of each secret in its strings replaced by ***."""
    found = sorted({s for s in secrets if s and len(s) >= MIN_SECRET}, key=len, reverse=True)
    if not found:
        return data

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            for secret in found:
                value = value.replace(secret, MASK)
            return value
        if isinstance(value, dict):
            return {clean(k): clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    return clean(data)
