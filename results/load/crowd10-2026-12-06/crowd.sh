#!/usr/bin/env bash
# The crowd (issue 38), 10 minutes: the app on llama.cpp (demo, default order, no tune), API on;
# 64 chats + 8 API clients for 600 s, then 16 chats + 8 API clients for 150 s (one loadtest each, same app).
set -u
cd "$(dirname "$0")/../../.."
OUT=${1:-results/load/crowd}
mkdir -p "$OUT"
lscpu | grep 'Model name' > "$OUT/cpu.txt"
DATA=$(mktemp -d)
ERNIE_PATHS__DATA_DIR=$DATA ERNIE_API__ENABLED=true ERNIE_TUNE__ENABLED=false ERNIE_ENGINE__NAME=llama.cpp \
ERNIE_API__QUOTAS__CONCURRENT=4 ERNIE_API__QUOTAS__REQUESTS_PER_MINUTE=600 HF_HUB_OFFLINE=1 \
  .venv/bin/chainlit run app.py --headless --port 8601 > "$OUT/app.log" 2>&1 &
APP=$!
for i in $(seq 1 300); do
  curl -sf http://127.0.0.1:8601/healthz >/dev/null && break; sleep 2; done
curl -s http://127.0.0.1:8601/healthz > "$OUT/health-before.json"
for level in "64 ${DUR64:-600}" "16 ${DUR16:-150}"; do
  set -- $level
  mkdir -p "$OUT/$1"
  .venv/bin/python -m backend loadtest --url http://127.0.0.1:8601 --sessions $1 --duration $2 \
    --max-tokens 64 --api-clients 8 --app-pid $APP --out "$OUT/$1" 2>&1 | tail -60 > "$OUT/$1/console.txt"
done
curl -s http://127.0.0.1:8601/healthz > "$OUT/health-after.json"
kill $APP; sleep 5; kill -9 $APP 2>/dev/null; pkill -f "llama-server.*$DATA" ; rm -rf "$DATA"
