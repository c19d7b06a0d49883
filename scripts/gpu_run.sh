#!/usr/bin/env bash
# On the lent GPU machine: install the offline vLLM bundle (../shared/gpu/README.md) and the wheels in
# .whl, then run scripts/gpu_tune.py; results go to $OUT/tune.tar.gz (one file: the tool returns few).
# usage: bash scripts/gpu_run.sh EXPERIMENT...
set -uo pipefail
cd "$(dirname "$0")/.."
W=/tmp/gpub; SITE=/tmp/site; mkdir -p "$W"
python3 -c "import tarfile; tarfile.open('.gpu/gpubundle.tar.xz').extractall('$W', filter='data')" || exit 3
rm -rf "$SITE"; mkdir -p "$SITE"
python3 -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check --target "$SITE" \
  "$W"/gpubundle/wheels/*.whl .whl/*.whl || exit 4
cp -a "$W"/gpubundle/vllm_stripped/. "$SITE"/
export PYTHONPATH="$SITE:$PWD" VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import yaml, httpx, tqdm, tenacity, pydantic, openai, httpx2, torch, transformers, vllm; \
print('env ok: vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" || exit 5
timeout "${TUNE_TIMEOUT:-520}" python3 scripts/gpu_tune.py /tmp/tune "$W/gpubundle/ernie03b" "$@"
echo "gpu_tune exit $?"
for f in /tmp/tune/*/engine/logs/engine.log; do echo "== $f"; grep -E "ERROR|Error|error:|graph|compile|Available KV|maximum concurrency|init engine" "$f" | tail -8; done
tar czf "${OUT:-/tmp}/tune.tar.gz" -C /tmp --exclude=cache tune
