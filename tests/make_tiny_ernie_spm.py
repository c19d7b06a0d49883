"""Build a random-weight Ernie4_5ForCausalLM whose tokenizer is a SentencePiece tokenizer.model, as the real one's.

usage: python tests/make_tiny_ernie_spm.py OUT_DIR [--arch tiny|0.3b] [--seed N] [--text-only]
Run with the engine's interpreter (needs sentencepiece, torch, transformers). This is the folder layout
baidu/ERNIE-4.5-0.3B-PT ships (config.json, tokenizer.model, tokenizer_config.json with
added_tokens_decoder, generation_config.json, model.safetensors), so the GGUF conversion
(backend.child.gguf_convert) is exercised for real. The tokenizer is a byte-fallback BPE trained offline
on the built-in corpus of make_tiny_ernie.py. With --arch 0.3b the weights have the exact
ERNIE-4.5-0.3B shape (random, bf16, about 0.7 GB) and the vocabulary is padded to 103424 ids by the
converter, as for the real model; use it to measure llama.cpp's speed on the architecture. Random weights mostly
pick padding ids or byte pieces, which carry no text (the client's first text then comes seconds late); --text-only
zeroes every embedding row but the pieces that are text, so greedy replies carry text from their first token and the
first text is a figure too (the same shapes: the same speed).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_ernie import (
    CHAT_TEMPLATE,
    CORPUS,
    REAL_03B,
    TINY,
    model_config,
    write_generation_config,
    write_random_weights,
)

USER_SYMBOLS = ["<|begin_of_sentence|>", "<|end_of_sentence|>", "<mask:0>", "<mask:1>"]


def train_tokenizer(out: Path) -> object:
    """Train a 1024-piece byte-fallback BPE (<unk>=0, <s>=1, </s>=2) and write tokenizer.model; return it."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines() * 4),
        model_writer=model,
        vocab_size=1024,
        model_type="bpe",
        character_coverage=1.0,
        byte_fallback=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        user_defined_symbols=USER_SYMBOLS,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
        # Like the tokenizers of chat models: keep newlines and runs of spaces. SentencePiece's default
        # (nmt_nfkc) turns "\n" into a space, which transformers applies and llama.cpp does not.
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
    )
    (out / "tokenizer.model").write_bytes(model.getvalue())
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def text_pieces(sp: object) -> list[int]:
    """The ids of the tokenizer's pieces that are text: not control, unknown, byte or user-defined symbols."""
    size = sp.vocab_size()  # type: ignore[attr-defined]
    plain = (sp.is_control, sp.is_unknown, sp.is_byte, sp.is_unused)  # type: ignore[attr-defined]
    return [i for i in range(size) if not any(f(i) for f in plain) and sp.id_to_piece(i) not in USER_SYMBOLS]  # type: ignore[attr-defined]


def main(out: Path, arch: str, seed: int, text_only: bool = False) -> None:
    out.mkdir(parents=True, exist_ok=True)
    sp = train_tokenizer(out)
    ids = {piece: sp.piece_to_id(piece) for piece in ["<unk>", "<s>", "</s>", *USER_SYMBOLS]}  # type: ignore[attr-defined]
    decoder = {
        str(i): {"content": piece, "special": True, "lstrip": False, "rstrip": False, "normalized": False}
        for piece, i in ids.items()
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "LlamaTokenizer",
                "add_bos_token": False,
                "add_eos_token": False,
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<unk>",
                "cls_token": "<|begin_of_sentence|>",
                "sep_token": "<|end_of_sentence|>",
                "additional_special_tokens": ["<|begin_of_sentence|>", "<|end_of_sentence|>"],
                "added_tokens_decoder": decoder,
                "model_max_length": 131072,
                "clean_up_tokenization_spaces": False,
                "legacy": True,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
    )
    real = arch == "0.3b"
    shape = REAL_03B if real else {**TINY, "vocab_size": sp.vocab_size()}  # type: ignore[attr-defined]
    config = model_config(shape, ids, real)
    config["max_position_embeddings"] = 131072 if real else 4096
    (out / "config.json").write_text(json.dumps(config, indent=2))
    write_random_weights(out, seed, text_pieces(sp) if text_only else None)
    write_generation_config(out, ids)
    print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--arch", choices=["tiny", "0.3b"], default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--text-only", action="store_true", help="greedy replies carry text (see above)")
    args = parser.parse_args()
    main(args.out, args.arch, args.seed, args.text_only)
