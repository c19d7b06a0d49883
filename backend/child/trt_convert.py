"""Hugging Face folder -> TensorRT-LLM checkpoint, the first step of `python -m backend build-trt-engine`.

usage: python -m backend.child.trt_convert MODEL_DIR CHECKPOINT_DIR DTYPE TP_SIZE
Run with TensorRT-LLM's interpreter. It does what TensorRT-LLM's per-model examples/*/convert_checkpoint.py
scripts do (those ship with its sources, not its wheel): the architecture's model class from
tensorrt_llm.models.MODEL_MAP, from_hugging_face() per tensor-parallel rank, save_checkpoint().
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    """Convert MODEL_DIR into a TensorRT-LLM checkpoint in CHECKPOINT_DIR."""
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    model_dir, out_dir, dtype, tp = argv[0], Path(argv[1]), argv[2], int(argv[3])
    from tensorrt_llm.mapping import Mapping
    from tensorrt_llm.models import MODEL_MAP

    arch = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))["architectures"][0]
    model_cls = MODEL_MAP.get(arch)
    if model_cls is None:
        print(f"TensorRT-LLM's TensorRT backend has no model class for {arch}.", file=sys.stderr)
        return 1
    out_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(tp):
        mapping = Mapping(world_size=tp, rank=rank, tp_size=tp)
        model = model_cls.from_hugging_face(model_dir, dtype, mapping=mapping)
        model.save_checkpoint(str(out_dir), save_config=(rank == 0))
        del model
    print(f"Checkpoint ({arch}, {dtype}, tp {tp}) written to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
