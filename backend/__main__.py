"""Project commands: python -m backend <command> [args]. Run without arguments for the list."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "check-prompts": ("backend.prompts.templates", "validate the prompt templates folder (exit 1 on problems)"),
    "check-config": ("backend.config", "validate config/backend.yaml and ERNIE_* overrides"),
    "loadtest": ("backend.benchmarks.loadtest", "many chat sessions at once through the app's websocket"),
    "prepare-model": ("backend.models.resolve", "resolve the model now (converts the offline demo model once)"),
    "check-flags": ("backend.serving.preflight", "check engine flags against the installed engine's own parser"),
    "build-trt-engine": ("backend.engines.trtllm", "build the TensorRT-LLM engine for trtllm.backend: tensorrt"),
    "bench": ("backend.benchmarks.run", "benchmark latency/throughput against concurrency, HF baseline, app overhead"),
    "doctor": ("backend.ops.doctor", "check the app, the engine, its metrics and its log; explain known failures"),
    "convert-gguf": ("backend.models.gguf", "convert a model folder to GGUF for llama.cpp now (cached)"),
    "add-user": ("backend.accounts.login", "add a login user or change a password (see docs/accounts.md)"),
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the command's module main(argv)."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in COMMANDS:
        print("usage: python -m backend <command> [args]\n\ncommands:")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:<17} {text}")
        return 0 if not args or args[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[args[0]][0])
    return int(module.main(args[1:]))


if __name__ == "__main__":
    sys.exit(main())
