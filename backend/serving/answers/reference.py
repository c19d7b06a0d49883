"""The float32 reference an engine's answers are compared with: the file backend.child.logprob_reference writes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.engines.dialect import Position


@dataclass(frozen=True)
class PromptReference:
    """One chat prompt of the reference: its messages, their token ids, the greedy continuation and its positions."""

    name: str
    messages: list[dict[str, str]]
    prompt_ids: list[int]
    continuation_ids: list[int]
    positions: list[Position]


@dataclass(frozen=True)
class Reference:
    """The file written by backend.child.logprob_reference."""

    model: str
    dtype: str
    top: int
    prompts: list[PromptReference]
    seconds: float = 0.0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reference:
        """Build a Reference from the JSON object (version 1)."""
        if data.get("version") != 1:
            raise ValueError(f"unsupported reference version {data.get('version')!r}")
        prompts = [
            PromptReference(
                name=str(p["name"]),
                messages=[dict(m) for m in p["messages"]],
                prompt_ids=[int(t) for t in p["prompt_ids"]],
                continuation_ids=[int(t) for t in p["continuation_ids"]],
                positions=[
                    Position([(int(i), float(v)) for i, v in q["top"]], float(q["chosen_logprob"]))
                    for q in p["positions"]
                ],
            )
            for p in data["prompts"]
        ]
        return cls(str(data["model"]), str(data["dtype"]), int(data["top"]), prompts, float(data.get("seconds", 0)))

    @classmethod
    def load(cls, path: Path | str) -> Reference:
        """Read a reference JSON file."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
