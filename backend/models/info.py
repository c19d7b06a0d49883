"""What a local model folder's config.json says about running it (architecture, quantization, heads)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelInfo:
    """The parts of a model's config.json that decide what can run it."""

    path: str
    architectures: tuple[str, ...] = ()
    quant_method: str | None = None
    num_attention_heads: int | None = None


def read_model_info(model: str) -> ModelInfo | None:
    """Read a local model folder's config.json; None for a hub id, a GGUF file or an unreadable file."""
    config = Path(model).expanduser() / "config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    quant = data.get("quantization_config") or {}
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    heads = data.get("num_attention_heads")
    return ModelInfo(
        path=str(model),
        architectures=tuple(str(a) for a in data.get("architectures") or ()),
        quant_method=str(method).lower() if method else None,
        num_attention_heads=heads if isinstance(heads, int) else None,
    )
