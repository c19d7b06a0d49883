#!/usr/bin/env bash
# On the lent GPU machine: install the offline vLLM bundle (../shared/gpu/README.md) and the wheels in
# .whl, then run scripts/gpu/gpu_tune.py: one engine alone on the GPU per round, the configurations in the
# order given (alternate them: A B A B ...). Results go straight to $OUT (rounds.jsonl grows round by
# round, so a call cut short keeps its whole rounds), the engine logs to $OUT/logs-CALL.tar.gz.
# usage: BUDGET_S=500 bash scripts/gpu/gpu_run.sh CALL_LABEL CONFIG...
#        bash scripts/gpu/gpu_run.sh app-path [ROUNDS]   (the app's client against the server: scripts/gpu/gpu_app_path.py)
#        bash scripts/gpu/gpu_run.sh first-reply [ROUNDS]  (a cold start, then warm-up off/on alternated: measure_first_reply)
#        bash scripts/gpu/gpu_run.sh restart [ROUNDS]      (a cold start, then the kept engine adopted / a fresh start on
#             warm caches, alternated: measure_restart)
#        bash scripts/gpu/gpu_run.sh app-share [PROFILE]   (the same app, results/app-share/measure_app_share.py: what the app adds to
#             the first text in fresh and growing chats; env APP_SHARE_LEVELS, APP_SHARE_ROUNDS; as `chat`, after `setup`)
#        bash scripts/gpu/gpu_run.sh price                 (issue 43: FP8 priced against bf16 and the first token's split at
#             16 users and in long chats, engines at once on one GPU: scripts/gpu/gpu_price.py; env PRICE_CONFIGS, PRICE_ROUNDS,
#             PRICE_EXTRAS=0 for the engines' levels alone)
#        bash scripts/gpu/gpu_run.sh start                 (issue 43: a fresh start on warm caches, vLLM's `serve` command
#             against its API server module, alternated: scripts/gpu/gpu_start.py; env START_ROUNDS, START_PROFILE)
#        bash scripts/gpu/gpu_run.sh clients               (issue 43: the first token at 16 users measured from one client
#             process or from 16: scripts/gpu/gpu_clients.py; env CLIENTS_ROUNDS)
#        bash scripts/gpu/gpu_run.sh supervise CONFIG...  (readiness, a GPU process killed, stop: scripts/gpu/gpu_supervise.py)
#        bash scripts/gpu/gpu_run.sh chat [PROFILE]        (the Chainlit app on the GPU, driven by `python -m backend
#             loadtest`; needs .gpu/app/appsite.tar.xz, the app's packages for Python 3.12: scripts/gpu/gpu_appsite.py.
#             Bundle and app site do not fit one call's carry together: run it right after another call, while the
#             machine is warm, carrying .gpu/app and .whl only; it reuses the vLLM that call installed.
#             `bash scripts/gpu/gpu_run.sh setup` only installs, for that)
#   BUDGET_S: seconds from now by which the last round must have ended (keep it under the call's limit;
#   a round is started only when the longest start, measurement and stop seen so far still fit).
#   Configurations: see CONFIGS in scripts/gpu/gpu_tune.py (defaults, h200, ...).
set -uo pipefail
cd "$(dirname "$0")/../.."
export TUNE_DEADLINE=$(( $(date +%s) + ${BUDGET_S:-500} ))
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
LABEL="${1:?usage: gpu_run.sh CALL_LABEL CONFIG...}"; shift
W=/tmp/gpub; SITE=/tmp/site; mkdir -p "$W"
if [ ! -d "$W/gpubundle" ] && [ ! -f .gpu/gpubundle.tar.xz ]; then
  echo "no vLLM here: carry .gpu/gpubundle.tar.xz, or run this right after a call that did (warm machine)"; exit 3
fi
if [ ! -d "$W/gpubundle" ]; then  # a warm machine from an earlier call keeps it
  python3 -c "import tarfile; tarfile.open('.gpu/gpubundle.tar.xz').extractall('$W', filter='data')" || exit 3
fi
if [ ! -d "$SITE/vllm" ]; then
  rm -rf "$SITE"; mkdir -p "$SITE"
  python3 -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check --target "$SITE" \
    "$W"/gpubundle/wheels/*.whl .whl/*.whl || exit 4
  cp -a "$W"/gpubundle/vllm_stripped/. "$SITE"/
fi
# The app's own packages (scripts/gpu/gpu_appsite.py), where carried: for the app (`chat`, `app-share`), and beneath
# the bundle's for gpu_tune.py, whose project modules need some the bundle lacks (sqlalchemy).
APPSITE=/tmp/appsite
if [ -f .gpu/app/appsite.tar.xz ]; then
  rm -rf "$APPSITE"; mkdir -p "$APPSITE"; tar xJf .gpu/app/appsite.tar.xz -C "$APPSITE" || exit 6
fi
export PYTHONPATH="$SITE:$PWD" VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export PATH="$SITE/bin:$PATH"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
python3 -c "import yaml, httpx, tqdm, tenacity, pydantic, openai, httpx2, torch, transformers, vllm; \
print('env ok: vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" || exit 5
echo "[run] setup took $SECONDS s; $(( TUNE_DEADLINE - $(date +%s) )) s left for rounds"
if [ "$LABEL" = setup ]; then  # only the installation above, for a `chat` call right after it
  exit 0
fi
if [ "$LABEL" = chat ] || [ "$LABEL" = app-share ]; then  # the app itself (Chainlit) starting the engine on the GPU
  [ -d "$APPSITE/chainlit" ] || { echo "no app packages here: carry .gpu/app (scripts/gpu/gpu_appsite.py)"; exit 6; }
  # The engine runs in vLLM's environment, the app in its own (app packages first, the bundle's beneath them).
  printf '#!/bin/sh\nPYTHONPATH=%s exec python3 "$@"\n' "$SITE:$PWD" > /tmp/enginepy && chmod +x /tmp/enginepy
  export ERNIE_ENGINE__NAME=vllm ERNIE_ENGINE__PYTHON=/tmp/enginepy ERNIE_ENGINE__PROFILE="${1:-h200}"
  export ERNIE_ENGINE__FLAGS__EXTRA_ARGS='["--attention-backend", "TRITON_ATTN"]'
  export ERNIE_MODEL__ID="$W/gpubundle/ernie03b" ERNIE_MODEL__LOAD_FORMAT=dummy ERNIE_PATHS__DATA_DIR=/tmp/chat-data
fi
if [ "$LABEL" = app-share ]; then  # the app's share of the first text, fresh and growing chats (measure_app_share.py)
  # APP_SHARE_LEVELS, APP_SHARE_ROUNDS: as the script's --levels and --rounds; replies of 256 tokens at most.
  PYTHONPATH="$APPSITE:$SITE:$PWD" python3 results/app-share/measure_app_share.py --python python3 \
    --rounds "${APP_SHARE_ROUNDS:-3}" --max-tokens 256 --levels "${APP_SHARE_LEVELS:-fresh:1:30,growing:1:75}" \
    --out "$OUT/app-share" 2>&1 | grep -v "^The model hub" | tee "$OUT/console-$LABEL.txt"
  for f in /tmp/app-share-*/logs/engine.log; do tail -c 200000 "$f" > "$OUT/app-share/engine-log-tail.txt"; done
  exit 0
elif [ "$LABEL" = chat ]; then  # many chats through the app's websocket (python -m backend loadtest)
  PYTHONPATH="$APPSITE:$SITE:$PWD" python3 -m chainlit run app.py --headless --host 127.0.0.1 --port 8501 \
    > "$OUT/app-console.txt" 2>&1 &
  APP=$!
  get() {  # GET URL [FILE]: prints the HTTP status, the body to FILE (no curl needed)
    python3 -c 'import sys, urllib.request as u, urllib.error as e
try: r = u.urlopen(sys.argv[1], timeout=5); code, body = r.status, r.read()
except e.HTTPError as x: code, body = x.code, x.read()
except OSError: code, body = 0, b""
open(sys.argv[2], "wb").write(body) if len(sys.argv) > 2 else None; print(code)' "$@"
  }
  for _ in $(seq 1 300); do  # /healthz answers 200 once the engine the app started is ready
    code=$(get http://127.0.0.1:8501/healthz "$OUT/healthz.json"); [ "$code" = 200 ] && break
    kill -0 $APP 2>/dev/null || break; sleep 1
  done
  echo "[chat] /healthz $code after $SECONDS s: $(cat "$OUT/healthz.json" 2>/dev/null | head -c 600)"
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
  # CHAT_KINDS: growing (default), fresh, or fresh,growing (backend/benchmarks/loadtest.py).
  # CHAT_SESSIONS: one load run per entry, in that order (e.g. "1 16 1 16 1 16" alternates); CHAT_WARMUP_S first,
  # unmeasured, at the largest entry (the engine's first requests after it is ready take seconds: new shapes).
  read -r -a LOADS <<< "${CHAT_SESSIONS:-16}"
  load() {  # SESSIONS SECONDS OUT_DIR
    PYTHONPATH="$APPSITE:$SITE:$PWD" python3 -m backend loadtest --url http://127.0.0.1:8501 --sessions "$1" \
      --duration "$2" --max-tokens 256 --app-pid $APP --out "$3" --chats "${CHAT_KINDS:-growing}" 2>&1 | tail -60
    echo "[chat] loadtest $1 sessions exit ${PIPESTATUS[0]}"
  }
  [ "${CHAT_WARMUP_S:-0}" -gt 0 ] && load "$(printf '%s\n' "${LOADS[@]}" | sort -n | tail -1)" "$CHAT_WARMUP_S" /tmp/warmup
  i=0; for n in "${LOADS[@]}"; do  # the engine's own /metrics around each run: its side of the first token
    d="$OUT/chat/$i-sessions-$n"; mkdir -p "$d"; get http://127.0.0.1:8501/metrics/engine "$d/engine-before.txt" >/dev/null
    load "$n" "${CHAT_DURATION_S:-60}" "$d"; get http://127.0.0.1:8501/metrics/engine "$d/engine-after.txt" >/dev/null
    i=$((i+1))
  done
  get http://127.0.0.1:8501/metrics "$OUT/app-metrics.txt"; grep -E '^ernie_(replies_total|errors_total|backend_restarts_total|backend_ready)' "$OUT/app-metrics.txt" | head -20
  kill -TERM $APP; wait $APP; echo "app exit $?"
  sleep 2; echo "[chat] on the GPU after the app stopped: '$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)'"
  cp -r /tmp/chat-data/logs "$OUT/chat-logs" 2>/dev/null
  ls -lR "$OUT" | head -40; exit 0
elif [ "$LABEL" = first-reply ] || [ "$LABEL" = restart ]; then  # the engine as the app starts it (ChatService)
  export ERNIE_ENGINE__NAME=vllm ERNIE_ENGINE__PYTHON=python3 ERNIE_ENGINE__PROFILE=h200
  export ERNIE_ENGINE__FLAGS__EXTRA_ARGS='["--attention-backend", "TRITON_ATTN"]'
  export ERNIE_MODEL__ID="$W/gpubundle/ernie03b" ERNIE_MODEL__LOAD_FORMAT=dummy ERNIE_PATHS__CACHE_DIR=/tmp/ernie-cache
  if [ "$LABEL" = restart ]; then  # the kept engine adopted against a fresh start (results/restart/measure_restart.py)
    python3 results/restart/measure_restart.py --rounds "${1:-3}" --replies 10 --out "$OUT/restart" 2>&1 \
      | grep -v "^The model hub" | tee "$OUT/console-$LABEL.txt"
    for f in /tmp/restart-*/logs/engine.log; do cp "$f" "$OUT/restart/engine.log" 2>/dev/null; done
    du -sh /tmp/ernie-cache/* 2>/dev/null
    exit 0
  fi
  # the warm-up and the compile caches (results/first-reply/measure_first_reply.py)
  python3 results/first-reply/measure_first_reply.py --prime --rounds "${1:-2}" --replies 10 --out "$OUT/first-reply" 2>&1 \
    | grep -v "^The model hub" | tee "$OUT/console-$LABEL.txt"
  for f in /tmp/first-reply-*/*/logs/engine.log; do  # each start's engine log: where its seconds went
    d=$(basename "$(dirname "$(dirname "$f")")"); cp "$f" "$OUT/first-reply/engine-$d.log" 2>/dev/null
  done
  du -sh /tmp/ernie-cache/* 2>/dev/null
  exit 0
elif [ "$LABEL" = price ]; then  # issue 43: FP8 priced against bf16, the first token's split (scripts/gpu/gpu_price.py)
  python3 scripts/gpu/gpu_price.py "$OUT" "$W/gpubundle/ernie03b" 2>&1 | grep -v "^The model hub" | tee "$OUT/console-$LABEL.txt"
  (cd "$OUT" && ls engine-*.log >/dev/null 2>&1 && tar czf "engine-logs-$LABEL.tar.gz" engine-*.log && rm -f engine-*.log)
  # What importing each entry point costs (vLLM's CLI `serve`, and its api_server module), one after the other.
  TIMEFORMAT="%R s"
  # (`vllm ... serve` imports every subcommand's module in main(); the api_server module is what serve runs)
  CLI="vllm.entrypoints.cli.benchmark.main, vllm.entrypoints.cli.collect_env, vllm.entrypoints.cli.launch"
  CLI="$CLI, vllm.entrypoints.cli.openai, vllm.entrypoints.cli.run_batch, vllm.entrypoints.cli.serve"
  for m in "$CLI" vllm.entrypoints.openai.api_server; do
    [ "${PRICE_EXTRAS:-1}" = 0 ] && break  # FP8 priced alone
    [ $(( TUNE_DEADLINE - $(date +%s) )) -gt 40 ] || { echo "[price] import times: no time left"; break; }
    f="$OUT/importtime-$(echo "$m" | cut -c1-24 | tr -c 'a-z0-9._\n' '_').txt"
    echo "[price] import $m: $( { time python3 -X importtime -c "import $m" 2> "$f"; } 2>&1 )"
  done
  ls -l "$OUT"; exit 0
elif [ "$LABEL" = clients ]; then  # issue 43: the first token's time in one client process or 16 (gpu_clients.py)
  python3 scripts/gpu/gpu_clients.py "$OUT/clients" "$W/gpubundle/ernie03b" 2>&1 | grep -v "^The model hub" \
    | tee "$OUT/console-$LABEL.txt"
  (cd "$OUT/clients" && gzip -f engine-clients.log 2>/dev/null); ls -l "$OUT" "$OUT/clients"; exit 0
elif [ "$LABEL" = supervise ]; then
  python3 scripts/gpu/gpu_supervise.py "$OUT" "$W/gpubundle/ernie03b" "$@" 2>&1 | tee "$OUT/console-$LABEL.txt"
elif [ "$LABEL" = start ]; then  # a fresh start on warm caches: `serve` against the API server module (gpu_start.py)
  python3 scripts/gpu/gpu_start.py "$OUT/start" "$W/gpubundle/ernie03b" 2>&1 | grep -v "^The model hub" \
    | tee "$OUT/console-$LABEL.txt"
  (cd "$OUT/start" && tar czf ../start-logs.tar.gz start-*.log && rm -f start-*.log)
  du -sh /tmp/start/cache/* 2>/dev/null; ls -l "$OUT" "$OUT/start"; exit 0
elif [ "$LABEL" = app-path ]; then  # the app's client against the server, one engine (scripts/gpu/gpu_app_path.py)
  python3 scripts/gpu/gpu_app_path.py "$OUT" "$W/gpubundle/ernie03b" "${1:-3}" 2>&1 | tee "$OUT/console-$LABEL.txt"
else
  [ -d "$APPSITE/chainlit" ] && export PYTHONPATH="$SITE:$APPSITE:$PWD"
  python3 scripts/gpu/gpu_tune.py "$OUT" "$W/gpubundle/ernie03b" "$LABEL" "$@" 2>&1 | tee "$OUT/console-$LABEL.txt"
fi
echo "gpu_tune exit ${PIPESTATUS[0]}"
# At most 8 files come back from a call: py-spy's profiles (TUNE_PROFILE=1) travel as one archive.
if ls "$OUT"/pyspy-*.txt >/dev/null 2>&1; then
  tar czf "$OUT/pyspy-$LABEL.tar.gz" -C "$OUT" $(cd "$OUT" && ls pyspy-*.txt) && rm -f "$OUT"/pyspy-*.txt
fi
tar czf "$OUT/logs-$LABEL.tar.gz" -C /tmp/tune --exclude=cache --exclude=unused --exclude=engine.key . 2>/dev/null
ls -l "$OUT"
