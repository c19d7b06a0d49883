#!/bin/bash
# Three `python -m backend tune --force` in a row with the default configuration, offline (the demo model), on a
# quiet machine; each one's table and the kept JSON.
cd /work/main
OUT=results/cpu-engines/zen3-avx2-2026-12-06/tunes; mkdir -p $OUT
lscpu | grep "Model name" > $OUT/cpu.txt
export HF_ENDPOINT=http://127.0.0.1:9 HF_HOME=/tmp/three-tunes-hf ERNIE_MODEL__HUB_TIMEOUT_S=1
for i in 1 2 3; do
  echo "load before: $(cat /proc/loadavg)" > $OUT/tune-$i.txt
  /usr/bin/time -f "wall %e s" .venv/bin/python -m backend tune --force >> $OUT/tune-$i.txt 2>&1
  echo "load after: $(cat /proc/loadavg)" >> $OUT/tune-$i.txt
  cp "$(ls -t ~/.cache/ernie-chat/tune/*.json | head -1)" $OUT/tune-$i.json
done
