"""Turn a Hugging Face ERNIE-4.5 folder into a GGUF file for llama.cpp, and quantize it.

Runs with the engine's interpreter (it needs gguf, numpy, torch, safetensors, sentencepiece):
    python -m backend.child.gguf_convert SRC_DIR OUT.gguf [--quant bf16|q8_0|q4_k_m] [--bf16 BF16.gguf]
        [--quantize-tool .venv-engine/llama.cpp/bin/llama-quantize]
    python -m backend.child.gguf_convert --gguf IN.gguf OUT.gguf --quant q8_0 --quantize-tool ...
The app calls it through backend.models.gguf, which caches the result. --gguf requantizes a GGUF file that is
already quantized (the offline demo's Q4_1 file into a format whose kernels batch better).

Why not llama.cpp's own convert_hf_to_gguf.py: it and its `conversion/` package (25,000 lines) exist
only in the source distribution, which is not kept after the build. This module is the part of it
that dense ERNIE-4.5 models need (the Ernie4_5Model class: same metadata, vocabulary and tensor types),
written with the `gguf` package, which is the same code as llama.cpp's bundled gguf-py. Quantizing uses llama.cpp itself
(llama-quantize, built beside llama-server), from the bf16 file.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ARCHITECTURES = ("Ernie4_5ForCausalLM", "Ernie4_5_ForCausalLM")
QUANTS = ("bf16", "q8_0", "q4_k_m")  # backend.models.gguf.QUANTS
# llama_ftype values (llama.h); bf16 is written directly, the others by llama_model_quantize.
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
PROGRESS_LINE = re.compile(r"\[\s*(\d+)/\s*(\d+)\]")


class ConversionError(Exception):
    """The folder cannot be converted; the message says why and what to do."""


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def check_source(src: Path) -> dict[str, Any]:
    """Return the folder's config.json after checking the folder is an ERNIE-4.5 model llama.cpp can run."""
    config = _json(src / "config.json")
    if not config:
        raise ConversionError(f"{src} has no config.json: point at a Hugging Face model folder.")
    archs = config.get("architectures") or []
    if not any(a in ARCHITECTURES for a in archs):
        raise ConversionError(
            f"{src} holds a {', '.join(archs) or 'model of unknown architecture'}; this converter handles "
            "ERNIE-4.5 dense models (Ernie4_5ForCausalLM). Convert other models with llama.cpp's "
            "convert_hf_to_gguf.py and set llamacpp.gguf to the file."
        )
    if not (src / "tokenizer.model").is_file():
        raise ConversionError(
            f"{src} has no tokenizer.model: the conversion needs the SentencePiece tokenizer the real "
            "ERNIE-4.5 models ship (a folder with only tokenizer.json cannot be converted here)."
        )
    if not list(src.glob("*.safetensors")):
        raise ConversionError(f"{src} has no *.safetensors weights (a config-only folder cannot be converted).")
    return config


def sentencepiece_vocab(src: Path, vocab_size: int) -> tuple[list[bytes], list[float], list[int]]:
    """Tokens, scores and token types from tokenizer.model, padded to vocab_size (as llama.cpp's converter)."""
    from sentencepiece import SentencePieceProcessor

    sp = SentencePieceProcessor()
    sp.LoadFromFile(str(src / "tokenizer.model"))
    tokens = [f"[PAD{i}]".encode() for i in range(vocab_size)]
    scores = [-10000.0] * vocab_size
    types = [TOKEN_UNUSED] * vocab_size
    for i in range(min(sp.vocab_size(), vocab_size)):
        tokens[i] = sp.IdToPiece(i).encode("utf-8")
        scores[i] = sp.GetScore(i)
        if sp.IsUnknown(i):
            types[i] = TOKEN_UNKNOWN
        elif sp.IsControl(i):
            types[i] = TOKEN_CONTROL
        elif sp.IsUnused(i):
            types[i] = TOKEN_UNUSED
        elif sp.IsByte(i):
            types[i] = TOKEN_BYTE
        else:
            types[i] = TOKEN_NORMAL
    added: dict[int, tuple[str, bool]] = {int(i): (t, False) for t, i in _json(src / "added_tokens.json").items()}
    for key, data in _json(src / "tokenizer_config.json").get("added_tokens_decoder", {}).items():
        added[int(key)] = (data["content"], bool(data.get("special")))
    for i, (text, special) in added.items():
        if i >= vocab_size:
            log.warning("ignoring added token %d (%r): beyond the vocabulary size %d", i, text, vocab_size)
            continue
        looks_special = text.startswith(("<|", "<")) and text.endswith(("|>", ">"))
        types[i] = TOKEN_CONTROL if special or looks_special else TOKEN_USER_DEFINED
        tokens[i] = (text if types[i] == TOKEN_CONTROL else text.replace("\u2581", " ")).encode("utf-8")
        scores[i] = -1000.0
    return tokens, scores, types


def space_after_special(src: Path) -> bool:
    """Whether transformers' tokenizer of `src` starts the text after a special token with "▁" (a space).

    llama.cpp's SentencePiece tokenizer adds that space to every text piece after a special token when the
    GGUF's add_space_prefix is true (its default). Transformers' own ERNIE and Llama tokenizers (non-legacy)
    do not, and every chat prompt of ERNIE starts with <|begin_of_sentence|>: with the default, llama.cpp saw
    one extra token at each turn (found by the canary's template check). The reference decides."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(src))
    special = next((t for t in tokenizer.all_special_tokens if t.startswith("<|")), tokenizer.bos_token or "<s>")
    ids = tokenizer(f"{special}User", add_special_tokens=False)["input_ids"]
    pieces = tokenizer.convert_ids_to_tokens(ids[1:])
    return bool(pieces) and str(pieces[0]).startswith("\u2581")


def source_tensors(src: Path) -> Iterator[tuple[str, Any]]:
    """Yield (name, float32 numpy array) for every tensor of the folder's safetensors files."""
    from safetensors import safe_open

    for file in sorted(src.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as fh:
            for name in fh.keys():
                yield name, fh.get_tensor(name).float().numpy()


def split_fused(name: str, data: Any, config: dict[str, Any]) -> list[tuple[str, Any]]:
    """Split the fused qkv_proj / up_gate_proj tensors some ERNIE checkpoints carry; rename ernie.* to model.*."""
    name = name.replace("ernie.", "model.")
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    if "qkv_proj.weight" in name:
        q, k = heads * head_dim, kv_heads * head_dim
        return [
            (name.replace("qkv_proj", "q_proj"), data[:q]),
            (name.replace("qkv_proj", "k_proj"), data[q : q + k]),
            (name.replace("qkv_proj", "v_proj"), data[q + k :]),
        ]
    if "up_gate_proj.weight" in name:
        half = data.shape[0] // 2
        return [
            (name.replace("up_gate_proj", "gate_proj"), data[:half]),
            (name.replace("up_gate_proj", "up_proj"), data[half:]),
        ]
    return [(name, data)]


def convert(src: Path, out: Path, progress: bool = True) -> Path:
    """Write `src` (an ERNIE-4.5 HF folder) as a bf16 GGUF file at `out` (norms stay float32); return `out`."""
    import gguf
    from tqdm import tqdm

    config = check_source(src)
    arch = gguf.MODEL_ARCH.ERNIE4_5
    blocks = int(config["num_hidden_layers"])
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(src.name)
    writer.add_block_count(blocks)
    writer.add_context_length(int(config.get("max_position_embeddings", 4096)))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(int(config["num_attention_heads"]))
    writer.add_head_count_kv(int(config["num_key_value_heads"]))
    # transformers >= 5 writes rope_theta under rope_parameters; the released config.json has it on top.
    rope = config.get("rope_parameters") or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-5)))
    if head_dim := config.get("head_dim"):
        writer.add_key_length(int(head_dim))
        writer.add_value_length(int(head_dim))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    tokens, scores, types = sentencepiece_vocab(src, int(config["vocab_size"]))
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_add_space_prefix(space_after_special(src))
    gguf.SpecialVocab(src, n_vocab=len(tokens)).add_to_gguf(writer)
    # ERNIE ends a turn with <|end_of_sentence|>; generation_config lists it beside </s>. llama.cpp stops
    # on end-of-turn tokens, and does not know this one by name.
    eos = _json(src / "generation_config.json").get("eos_token_id")
    extra = [i for i in (eos if isinstance(eos, list) else []) if i != config.get("eos_token_id")]
    if extra:
        writer.add_eot_token_id(int(extra[0]))

    names = gguf.get_tensor_name_map(arch, blocks)
    tied = config.get("tie_word_embeddings", False)
    n_files = len(list(src.glob("*.safetensors")))
    with tqdm(desc=f"Converting {src.name} to GGUF", unit=" tensors", disable=not progress, file=sys.stderr) as bar:
        for hf_name, data in source_tensors(src):
            for name, part in split_fused(hf_name, data, config):
                if tied and name == "lm_head.weight":
                    continue
                new_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
                if new_name is None:
                    raise ConversionError(f"Tensor {name} of {src} has no GGUF name for the ernie4_5 architecture.")
                # Like llama.cpp's converter: 1-D tensors and norms stay float32, matrices become bf16.
                qtype = gguf.GGMLQuantizationType.F32
                if part.ndim > 1 and not new_name.endswith("_norm.weight"):
                    qtype = gguf.GGMLQuantizationType.BF16
                writer.add_tensor(new_name, gguf.quants.quantize(part, qtype), raw_dtype=qtype)
                bar.update(1)
    log.info("Read %d tensors from %d file(s); writing %s", len(writer.tensors[0]), n_files, out)
    writer.write_header_to_file(path=out)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=progress)
    writer.close()
    return out


def quantize(src: Path, out: Path, quant: str, tool: Path, progress: bool = True) -> Path:
    """Quantize the GGUF file `src` to `quant` (one of QUANTS but bf16) at `out` with llama.cpp's llama-quantize."""
    from tqdm import tqdm

    if not tool.is_file():
        raise ConversionError(f"llama.cpp's quantizer {tool} is missing: build it with make setup-llamacpp.")
    # The portable kernels: quantizing is not worth a crash on a CPU that advertises more than it runs.
    env = {**os.environ, "GGML_BACKEND_PATH": str(tool.parent / "cpu" / "libggml-cpu-x64.so")}
    # --allow-requantize: `src` may be quantized already (the demo's Q4_1 file); a bf16 file is quantized as ever.
    cmd = [str(tool), "--allow-requantize", str(src), str(out), quant.upper(), str(os.cpu_count() or 1)]
    bar = tqdm(desc=f"Quantizing to {quant}", unit=" tensors", disable=not progress, file=sys.stderr)
    lines: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            # llama.cpp logs "[  12/ 201] name - [shape], type = ..." per tensor: that is the progress bar.
            match = PROGRESS_LINE.match(line)
            if match:
                bar.total, bar.n = int(match.group(2)), int(match.group(1))
                bar.refresh()
    bar.close()
    if proc.returncode != 0:
        tail = "\n".join(lines[-10:])
        raise ConversionError(f"llama.cpp could not quantize {src} to {quant} (exit code {proc.returncode}):\n{tail}")
    return out


def main(argv: list[str] | None = None) -> int:
    """Convert SRC to bf16 GGUF (or reuse --bf16), then quantize; write OUT atomically."""
    parser = argparse.ArgumentParser(prog="python -m backend.child.gguf_convert", description=__doc__.split("\n")[0])
    parser.add_argument(
        "src", type=Path, nargs="?", help="Hugging Face model folder (config.json, tokenizer.model, safetensors)"
    )
    parser.add_argument("out", type=Path, help="GGUF file to write")
    parser.add_argument("--gguf", type=Path, help="quantize this GGUF file (quantized already or not) instead of SRC")
    parser.add_argument("--quant", choices=QUANTS, default="bf16")
    parser.add_argument("--bf16", type=Path, help="an existing bf16 GGUF of SRC to quantize from (else made)")
    parser.add_argument("--quantize-tool", type=Path, help="llama.cpp's llama-quantize (for q8_0, q4_k_m)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    progress = not args.no_progress
    started = time.monotonic()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(f"{args.out.name}.tmp-{os.getpid()}")
    if (args.src is None) == (args.gguf is None):
        parser.error("give either SRC (a model folder) or --gguf (a GGUF file)")
    try:
        if args.gguf is not None:
            if args.quantize_tool is None:
                raise ConversionError("--quantize-tool (llama.cpp's llama-quantize) is needed for --gguf")
            quantize(args.gguf, tmp, args.quant, args.quantize_tool, progress)
        elif args.quant == "bf16":
            convert(args.src, tmp, progress)
        else:
            bf16 = args.bf16
            if bf16 is None or not bf16.is_file():
                bf16 = args.out.with_name(f"{args.out.stem}.bf16-tmp-{os.getpid()}.gguf")
                convert(args.src, bf16, progress)
            try:
                if args.quantize_tool is None:
                    raise ConversionError("--quantize-tool (llama.cpp's llama-quantize) is needed for " + args.quant)
                quantize(bf16, tmp, args.quant, args.quantize_tool, progress)
            finally:
                if args.bf16 is None or bf16 != args.bf16:
                    bf16.unlink(missing_ok=True)
        tmp.replace(args.out)
    except ConversionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        tmp.unlink(missing_ok=True)
    size = args.out.stat().st_size / 2**20
    log.info("Wrote %s (%.0f MiB, %s) in %.1f s", args.out, size, args.quant, time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
