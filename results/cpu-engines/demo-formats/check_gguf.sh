#!/bin/bash
# usage: check_gguf.sh FILE.gguf [variant]: serve FILE with llama-server as the app does, run the answer check
# against the shipped float32 reference of the demo's Q4_1 weights; print the verdict's figures.
F=$1; V=${2:-zen4}
P=/work/main/.venv-engine/llama.cpp/bin
PORT=$(python3 -c "import socket;s=socket.socket();s.bind(('127.0.0.1',0));print(s.getsockname()[1])")
GGML_BACKEND_PATH=$P/cpu/libggml-cpu-$V.so $P/llama-server --model $F --alias ernie-4.5-0.3b --host 127.0.0.1 --port $PORT --parallel 1 --ctx-size 4096 --threads 2 --flash-attn on --no-kv-unified --cache-ram 0 --jinja --no-webui > /tmp/check-$PORT.log 2>&1 &
SP=$!
for i in $(seq 1 60); do curl -s -o /dev/null -w "%{http_code}" http://127.0.0.1:$PORT/health 2>/dev/null | grep -q 200 && break; sleep 0.5; done
cd /work/main && .venv/bin/python -m backend check-answers config/references/reference-v1-b179c9523d0e6a0f.json --url http://127.0.0.1:$PORT --api llama.cpp --format q4_k_m --timeout 600 | python3 -c "
import json,sys; d=json.load(sys.stdin); s=d.get('stats',{})
print('$(basename $F)', d.get('passed'), 'median %.3f p95 %.3f max %.2f top1 %s/%s overlap %.2f misses %s' % (s['median'], s['p95'], s['max'], s['top1_agree'], s['positions'], s['topk_overlap_mean'], s.get('topk_misses')))"
kill $SP; wait $SP 2>/dev/null
