"""Compare a Hugging Face model's logits with its GGUF conversions' (run with the engine's interpreter).

usage: python compare_logits.py HF_DIR GGUF [GGUF ...]
Prints one JSON object per GGUF: whether llama.cpp tokenizes like SentencePiece, and the largest
logit difference over every position of a chat-formatted prompt, fed as the same token ids to both.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TEXT = "Hello! What is the capital of France? 你好 今天天气怎么样"  # no full-width punctuation: see the test
PROMPT = "<|begin_of_sentence|>User: Please write a short poem about the sea.\nAssistant: "


def main(src: Path, ggufs: list[Path]) -> None:
    import llama_cpp
    import numpy as np
    import sentencepiece as spm
    import torch
    from transformers import AutoModelForCausalLM

    sp = spm.SentencePieceProcessor(model_file=str(src / "tokenizer.model"))
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    for path in ggufs:
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, logits_all=True, n_threads=2, verbose=False)
        same_tokens = llm.tokenize(TEXT.encode(), add_bos=False, special=False) == sp.encode(TEXT)
        ids = llm.tokenize(PROMPT.encode(), add_bos=False, special=True)
        llm.eval(ids)
        ours = np.array(llm.scores[: len(ids)], dtype=np.float32)
        with torch.no_grad():
            ref = model(torch.tensor([ids])).logits[0].float().numpy()
        print(
            json.dumps(
                {
                    "gguf": path.name,
                    "tokens_match": same_tokens,
                    "special_start": ids[0] == sp.piece_to_id("<|begin_of_sentence|>"),
                    "n_tokens": len(ids),
                    "max_abs_diff": float(np.abs(ours - ref).max()),
                    "max_abs_logit": float(np.abs(ref).max()),
                    "argmax_agree": float((ours.argmax(-1) == ref.argmax(-1)).mean()),
                }
            ),
            flush=True,
        )
        llm.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]])
