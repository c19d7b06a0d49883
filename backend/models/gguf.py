"""GGUF files for llama.cpp, made once: a Hugging Face folder converted and quantized, cached by source + quant.

The conversion itself (backend.child.gguf_convert) runs in the engine's interpreter, which has gguf and torch
(quantizing runs llama.cpp's llama-quantize); this side picks the cache file, runs it when the file is
missing and reports failures.
Cache layout: <paths.cache_dir>/gguf/<folder name>-<key>/<folder name>.<quant>.gguf, where the key
hashes the folder's path and the size and time of every file the conversion reads. The bf16 file
stays beside the quantized one: it is the quantizer's input, so switching quantization is quick.

Each cache folder records its source (source.txt); whenever a file is served from the cache, the folders made from
the same source under another key (the source changed, or a converter that writes other files) and those whose
source is gone (a checkout removed, a model deleted) are removed, so the cache holds one copy per living source.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import time
from pathlib import Path

from backend.config import ROOT, AppConfig
from backend.errors import ModelConversionError, Phrase, ServiceError

log = logging.getLogger(__name__)

CONVERTER_VERSION = 2  # bump when backend.child.gguf_convert writes different files (2: add_space_prefix from HF)
QUANTS = ("bf16", "q8_0", "q4_k_m")  # config.LlamaFormat
UNMEASURED_QUANT = "q8_0"  # llamacpp.quantization auto before (or without) a tune: near-exact, 1.2-1.5x bf16's speed


def quantization(cfg: AppConfig) -> str:
    """The format a converted model is served in: llamacpp.quantization, or for auto the tune's choice (in cfg)."""
    quant = cfg.llamacpp.quantization
    return UNMEASURED_QUANT if quant == "auto" else quant


CONVERT_TIMEOUT_S = 3600
TAIL_LINES = 15


def source_key(source: Path) -> str:
    """Hash the folder's absolute path with the name, size and mtime of the files the conversion reads."""
    digest = hashlib.sha256(f"v{CONVERTER_VERSION}\n{source.resolve()}\n".encode())
    for file in sorted(source.iterdir()):
        if file.is_file() and (file.suffix in (".json", ".model", ".safetensors")):
            stat = file.stat()
            digest.update(f"{file.name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:12]


def cached_gguf(cfg: AppConfig, source: Path, quant: str) -> Path:
    """The cache file for `source` converted to `quant` (it may not exist yet)."""
    name = source.resolve().name
    return cfg.paths.cache / "gguf" / f"{name}-{source_key(source)}" / f"{name}.{quant}.gguf"


SOURCE_RECORD = "source.txt"  # in each cache folder: the absolute path of what it was made from


def keep_one_per_source(cfg: AppConfig, made: Path, source: Path) -> None:
    """Record `made`'s source in its folder, and remove the cache folders of the same source under another key and
    those whose source is gone (module docstring). Folders without a record (older releases') are left alone."""
    folder, origin = made.parent, str(source.resolve())
    try:
        (folder / SOURCE_RECORD).write_text(origin + "\n", encoding="utf-8")
        others = [f for f in folder.parent.iterdir() if f.is_dir() and f != folder]
    except OSError as exc:
        log.warning("GGUF cache %s not tidied: %s", folder.parent, exc)
        return
    for other in others:
        try:
            recorded = (other / SOURCE_RECORD).read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if recorded == origin or not Path(recorded).exists():
            why = "its source changed" if recorded == origin else f"its source {recorded} is gone"
            log.info("Removing the GGUF cache folder %s: %s", other, why)
            shutil.rmtree(other, ignore_errors=True)


def convert_log(cfg: AppConfig) -> Path:
    return cfg.paths.data / "logs" / "convert.log"


def _run_converter(python: str, args: list[str], log_file: Path | None) -> None:
    """Run backend.child.gguf_convert with `python`; its output goes to the terminal, or to `log_file`."""
    cmd = [python, "-m", "backend.child.gguf_convert", *args]
    if log_file is None:
        code = subprocess.run(cmd, cwd=ROOT, timeout=CONVERT_TIMEOUT_S).returncode
        tail = ""
    else:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("ab") as out:
            start = out.tell()
            out.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
            out.flush()
            proc = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=CONVERT_TIMEOUT_S)
            code = proc.returncode
        with log_file.open("rb") as fh:
            fh.seek(start)
            tail = "\n".join(fh.read().decode("utf-8", "replace").strip().splitlines()[-TAIL_LINES:])
    if code != 0:
        raise ModelConversionError.of(
            "model.gguf_failed",
            exit_code=code,
            tail=f"\n{tail}" if tail else "",
            log=Phrase("full_log", path=log_file) if log_file else "",
        )


def ensure_gguf(
    cfg: AppConfig,
    python: str,
    source: Path,
    quant: str,
    log_file: Path | None = None,
    quantize_tool: Path | None = None,
) -> Path:
    """Return the cached GGUF of `source` at `quant`, converting (bf16 first) and quantizing once when missing."""
    target = cached_gguf(cfg, source, quant)
    if target.is_file():
        keep_one_per_source(cfg, target, source)
        return target
    started = time.monotonic()
    bf16 = cached_gguf(cfg, source, "bf16")
    progress = [] if log_file is None else ["--no-progress"]
    if not bf16.is_file():
        log.info("Converting %s to GGUF bf16 (once) into %s", source, bf16.parent)
        _run_converter(python, [str(source), str(bf16), "--quant", "bf16", *progress], log_file)
    if quant != "bf16":
        log.info("Quantizing %s to %s (once)", bf16.name, quant)
        tool = ["--quantize-tool", str(quantize_tool)] if quantize_tool else []
        args = [str(source), str(target), "--quant", quant, "--bf16", str(bf16), *tool, *progress]
        _run_converter(python, args, log_file)
    log.info("GGUF %s ready in %.1f s", target, time.monotonic() - started)
    keep_one_per_source(cfg, target, source)
    return target


def requantized_gguf(cfg: AppConfig, source: Path, quant: str) -> Path:
    """The cache file for the GGUF file `source` requantized to `quant` (it may not exist yet)."""
    stem = source.name.removesuffix(".gguf")
    stat = source.stat()
    key = hashlib.sha256(f"{source.resolve()} {stat.st_size} {stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return cfg.paths.cache / "gguf" / f"{stem}-{key}" / f"{stem}.{quant}.gguf"


def ensure_requantized(
    cfg: AppConfig, python: str, source: Path, quant: str, quantize_tool: Path, log_file: Path | None = None
) -> Path:
    """Return the GGUF file `source` requantized to `quant`, made once (a few seconds for a 135M model)."""
    target = requantized_gguf(cfg, source, quant)
    if not target.is_file():
        started = time.monotonic()
        log.info("Requantizing %s to %s (once) into %s", source.name, quant, target.parent)
        progress = [] if log_file is None else ["--no-progress"]
        args = ["--gguf", str(source), str(target), "--quant", quant, "--quantize-tool", str(quantize_tool)]
        _run_converter(python, [*args, *progress], log_file)
        log.info("GGUF %s ready in %.1f s", target, time.monotonic() - started)
    keep_one_per_source(cfg, target, source)
    return target


def convert_gguf_command(
    cfg: AppConfig, python: str, quantize_tool: Path | None, source: Path | None = None, quant: str | None = None
) -> int:
    """`convert-gguf`: convert a model folder (default: model.id) to GGUF now, with progress bars; print the path.

    `python` is the engine's interpreter (it runs the converter), `quantize_tool` llama.cpp's llama-quantize."""
    folder = source or Path(cfg.model.id).expanduser()
    if not folder.is_dir():
        print(f"{folder} is not a model folder: give the folder of a Hugging Face ERNIE-4.5 model.")
        return 2
    try:
        path = ensure_gguf(cfg, python, folder, quant or quantization(cfg), quantize_tool=quantize_tool)
    except ServiceError as exc:
        print(exc)
        return 1
    print(path)
    return 0
