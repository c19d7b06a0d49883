#!/bin/bash
# usage: browser-screen.sh NAME [ENV=VALUE ...]: the app with these variables, one page at 1 user, 16 replies, 1 round
cd /work/main
name=$1; shift
env "$@" .venv/bin/chainlit run app.py --headless --host 127.0.0.1 --port 8501 > /tmp/bs-$name.app.log 2>&1 &
for i in $(seq 1 120); do
  if curl -s localhost:8501/healthz | grep -q '"state":"ready"'; then break; fi
  sleep 2
done
curl -s localhost:8501/healthz | head -c 400; echo
pgrep -fa llama-server | head -2 | cut -c1-300
.venv/bin/python results/browser/measure_browser.py --users 1 --rounds 1 --replies 16 --out /tmp/bs-$name > /tmp/bs-$name.log 2>&1
tail -5 /tmp/bs-$name.log
pkill -INT -f "chainlit run app.py"; sleep 6
