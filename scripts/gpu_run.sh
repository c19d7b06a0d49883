#!/usr/bin/env bash
# On the lent GPU machine: install the offline vLLM bundle (../shared/gpu/README.md) and the wheels in
# .whl, then run scripts/gpu_tune.py: one engine alone on the GPU per round, the configurations in the
# order given (alternate them: A B A B ...). Results go straight to $OUT (rounds.jsonl grows round by
# round, so a call cut short keeps its whole rounds), the engine logs to $OUT/logs-CALL.tar.gz.
# usage: BUDGET_S=500 bash scripts/gpu_run.sh CALL_LABEL CONFIG...
#        bash scripts/gpu_run.sh app-path [ROUNDS]   (the app's client against the server: scripts/gpu_app_path.py)
#   BUDGET_S: seconds from now by which the last round must have ended (keep it under the call's limit;
#   a round is started only when the longest start, measurement and stop seen so far still fit).
#   Configurations: see CONFIGS in scripts/gpu_tune.py (defaults, h200, ...).
set -uo pipefail
cd "$(dirname "$0")/.."
export TUNE_DEADLINE=$(( $(date +%s) + ${BUDGET_S:-500} ))
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
LABEL="${1:?usage: gpu_run.sh CALL_LABEL CONFIG...}"; shift
W=/tmp/gpub; SITE=/tmp/site; mkdir -p "$W"
if [ ! -d "$W/gpubundle" ]; then  # a warm machine from an earlier call keeps it
  python3 -c "import tarfile; tarfile.open('.gpu/gpubundle.tar.xz').extractall('$W', filter='data')" || exit 3
fi
if [ ! -d "$SITE/vllm" ]; then
  rm -rf "$SITE"; mkdir -p "$SITE"
  python3 -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check --target "$SITE" \
    "$W"/gpubundle/wheels/*.whl .whl/*.whl || exit 4
  cp -a "$W"/gpubundle/vllm_stripped/. "$SITE"/
fi
export PYTHONPATH="$SITE:$PWD" VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export PATH="$SITE/bin:$PATH"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
python3 -c "import yaml, httpx, tqdm, tenacity, pydantic, openai, httpx2, torch, transformers, vllm; \
print('env ok: vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" || exit 5
echo "[run] setup took $SECONDS s; $(( TUNE_DEADLINE - $(date +%s) )) s left for rounds"
if [ "$LABEL" = app-path ]; then  # the app's client against the server, one engine (scripts/gpu_app_path.py)
  python3 scripts/gpu_app_path.py "$OUT" "$W/gpubundle/ernie03b" "${1:-3}" 2>&1 | tee "$OUT/console-$LABEL.txt"
else
  python3 scripts/gpu_tune.py "$OUT" "$W/gpubundle/ernie03b" "$LABEL" "$@" 2>&1 | tee "$OUT/console-$LABEL.txt"
fi
echo "gpu_tune exit ${PIPESTATUS[0]}"
tar czf "$OUT/logs-$LABEL.tar.gz" -C /tmp/tune --exclude=cache --exclude=unused --exclude=engine.key . 2>/dev/null
ls -l "$OUT"
