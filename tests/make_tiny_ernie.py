"""Build a tiny random-weight Ernie4_5ForCausalLM (hidden 64, 2 layers) with an offline-trained tokenizer.

usage: python tests/make_tiny_ernie.py OUT_DIR [--arch 0.3b]
Run with the engine's interpreter (needs tokenizers, torch, transformers). With --arch 0.3b it writes
the exact ERNIE-4.5-0.3B-PT architecture's config.json without weights instead (serve it with vLLM's
--load-format dummy); the tokenizer is then padded to the real vocabulary size (103424) so every id
a random model samples decodes. The chat template is the real ERNIE 4.5 one (plain text).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SPECIAL = ["<unk>", "<s>", "</s>", "<|begin_of_sentence|>", "<|end_of_sentence|>", "<mask:0>", "<mask:1>"]
CORPUS = """
The quick brown fox jumps over the lazy dog. What is the capital of France? The capital of France is Paris.
Please write a short poem about the sea. Summarize the following text in three sentences.
Translate this sentence into English. Explain what this Python code does: def add(a, b): return a + b
Hello! How are you today? I am fine, thank you. Tell me a story about a small robot who learns to paint.
你好！今天天气怎么样？请写一首关于春天的诗。请总结下面这段话。请把这句话翻译成英文。解释一下这段代码。
人工智能正在改变我们的生活和工作方式。北京是中国的首都。上海是一座国际化的大城市。
我们一起去公园散步吧。这本书讲述了一个关于勇气和友谊的故事。学习编程需要耐心和练习。
""".strip()

CHAT_TEMPLATE = (
    "{%- if not add_generation_prompt is defined -%}{%- set add_generation_prompt = false -%}{%- endif -%}"
    "{{- '<|begin_of_sentence|>' -}}"
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{%- set content = message['content'] -%}"
    "{%- else -%}{%- set content = message['content'] | map(attribute='text') | join('') -%}{%- endif -%}"
    "{%- if message['role'] == 'system' -%}{{- content + '\\n' -}}"
    "{%- elif message['role'] == 'user' -%}{{- 'User: ' + content + '\\n' -}}"
    "{%- elif message['role'] == 'assistant' -%}{{- 'Assistant: ' + content + '<|end_of_sentence|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'Assistant: ' -}}{%- endif -%}"
)

REAL_03B = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 18,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "vocab_size": 103424,
}
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
}


def model_config(shape: dict, ids: dict, real: bool) -> dict:
    """config.json of an Ernie4_5ForCausalLM with `shape` (TINY or REAL_03B) and these special token ids."""
    return {
        "architectures": ["Ernie4_5ForCausalLM"],
        "model_type": "ernie4_5",
        **shape,
        "hidden_act": "silu",
        "max_position_embeddings": 131072 if real else 16384,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-05,
        "use_bias": False,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "bos_token_id": ids["<s>"],
        "eos_token_id": ids["</s>"],
        "pad_token_id": ids["<unk>"],
        "initializer_range": 0.02,
    }


def write_generation_config(out: Path, ids: dict) -> None:
    """Both end tokens; call after save_pretrained, which writes its own file with one end token only."""
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": ids["<s>"], "eos_token_id": [ids["</s>"], ids["<|end_of_sentence|>"]]})
    )


def build_tokenizer(vocab_size: int | None):
    """Train a byte-level BPE on the built-in corpus; pad to `vocab_size` ids when given."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        min_frequency=1,
        show_progress=False,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS.splitlines() * 4, trainer)
    if vocab_size:
        data = json.loads(tok.to_str())
        vocab = data["model"]["vocab"]
        nxt = max(vocab.values()) + 1
        i = 0
        while nxt < vocab_size:
            vocab[f"<filler_{i}>"] = nxt
            nxt += 1
            i += 1
        tok = Tokenizer.from_str(json.dumps(data))
    return tok


def main(out: Path, arch: str) -> None:
    real = arch == "0.3b"
    tok = build_tokenizer(REAL_03B["vocab_size"] if real else None)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL}
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<unk>",
                "cls_token": "<|begin_of_sentence|>",
                "sep_token": "<|end_of_sentence|>",
                "additional_special_tokens": ["<|begin_of_sentence|>", "<|end_of_sentence|>"],
                "model_max_length": 131072,
                "clean_up_tokenization_spaces": False,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
    )
    shape = REAL_03B if real else {**TINY, "vocab_size": tok.get_vocab_size(with_added_tokens=True)}
    config = model_config(shape, ids, real)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if not real:
        write_random_weights(out, 0)
    write_generation_config(out, ids)
    print(f"wrote {out}")


def write_random_weights(out: Path, seed: int, text_ids: list[int] | None = None) -> None:
    """Random bfloat16 weights (drawn from `seed`) for the config.json in `out`. With `text_ids`, every other row of
    the (tied) embedding is zero: greedy decoding then picks a token that carries text (random logits of ~1,000 text
    pieces have a maximum above the zero of the ~100,000 padding ids), at the same shapes and so the same speed."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out), dtype=torch.bfloat16)
    if text_ids is not None:
        with torch.no_grad():
            for table in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
                keep = torch.zeros(table.shape[0], dtype=torch.bool)
                keep[text_ids] = True
                table[~keep] = 0
    model.save_pretrained(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the model folder to write")
    parser.add_argument("--arch", choices=["tiny", "0.3b"], default="tiny", help="0.3b: the real shape, config only")
    args = parser.parse_args()
    main(args.out, args.arch)
