"""Run by the ENGINE's interpreter: print an engine's own command-line options (and version) as JSON.

usage: python -m backend.child.engine_probe version PACKAGE | vllm | trtllm
Only the standard library and the engine itself are imported here: this runs in the engine's
environment, not the app's. backend.engines.options runs it and caches what it prints.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

MARKER = "@@ENGINE-OPTIONS@@"


def version(package: str) -> int:
    """Print "VERSION FOLDER" from the package's version file, without importing it (a fraction of a second)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin:
        return 3
    root = Path(spec.origin).parent
    text = "".join(p.read_text() for p in (root / "_version.py", root / "version.py") if p.exists())
    match = re.search(r"__version__\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?['\"]([^'\"]+)", text)
    print((match.group(1) if match else "unknown") + " " + str(root))
    return 0


def vllm_options() -> dict[str, Any]:
    """vLLM's own server parser (the one `vllm serve` and the api_server module build), listed."""
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # releases before the utils split
        from vllm.utils import FlexibleArgumentParser
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # releases before 0.3x
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    import vllm

    parser = make_arg_parser(FlexibleArgumentParser())
    options = {}
    for action in parser._actions:
        for opt in action.option_strings:
            choices = [str(c) for c in action.choices] if action.choices else None
            options[opt] = {"nargs": action.nargs, "choices": choices}
    values = {}
    try:  # --quantization takes any string on the command line; this is the list vLLM accepts later
        from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

        values["--quantization"] = list(QUANTIZATION_METHODS)
    except Exception:
        pass
    return {"version": vllm.__version__, "options": options, "values": values}


def trtllm_options() -> dict[str, Any]:
    """trtllm-serve's click options, and the model architectures each TensorRT-LLM backend registers."""
    import click
    import tensorrt_llm
    from tensorrt_llm.commands import serve as serve_module

    command = getattr(serve_module, "main", None)
    if isinstance(command, click.Group):  # newer releases: `trtllm-serve` is a group, "serve" its default
        command = command.commands.get("serve", command)
    if not isinstance(command, click.Command):
        command = serve_module.serve
    options = {}
    for param in command.params:
        if isinstance(param, click.Option):
            choices = list(param.type.choices) if isinstance(param.type, click.Choice) else None
            for opt in [*param.opts, *param.secondary_opts]:
                options[opt] = {"nargs": 0 if param.is_flag else None, "choices": choices}
    architectures = {}
    try:
        from tensorrt_llm.models import MODEL_MAP  # the TensorRT (engine-build) backend

        architectures["tensorrt"] = sorted(MODEL_MAP)
    except Exception:
        pass
    try:
        import tensorrt_llm._torch.models  # registers the PyTorch backend's models
        from tensorrt_llm._torch.models import modeling_utils

        registry = getattr(modeling_utils, "MODEL_CLASS_MAPPING", None)
        registry = registry or getattr(modeling_utils, "_MODEL_CLASS_REGISTRY", {})
        if registry:
            architectures["pytorch"] = sorted(registry)
    except Exception:
        pass
    return {"version": tensorrt_llm.__version__, "options": options, "architectures": architectures}


def main(argv: list[str]) -> int:
    """Dispatch: version PACKAGE, vllm or trtllm."""
    if argv[:1] == ["version"] and len(argv) == 2:
        return version(argv[1])
    probes = {"vllm": vllm_options, "trtllm": trtllm_options}
    if len(argv) != 1 or argv[0] not in probes:
        print(__doc__, file=sys.stderr)
        return 2
    print(MARKER + json.dumps(probes[argv[0]]()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
