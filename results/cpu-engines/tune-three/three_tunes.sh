#!/bin/bash
# Three `python -m backend tune --force` in a row with the default configuration, offline (the demo model), on a
# quiet machine; each one's table and the kept JSON, in the folder given (default: this one).
cd "$(dirname "$0")/../../.."  # the repository root
OUT=${1:-results/cpu-engines/tune-three}  # where the tables and kept records go
mkdir -p "$OUT"
lscpu | grep "Model name" > $OUT/cpu.txt
export HF_ENDPOINT=http://127.0.0.1:9 HF_HOME=/tmp/three-tunes-hf ERNIE_MODEL__HUB_TIMEOUT_S=1
for i in 1 2 3; do
  echo "load before: $(cat /proc/loadavg)" > $OUT/tune-$i.txt
  /usr/bin/time -f "wall %e s" .venv/bin/python -m backend tune --force >> $OUT/tune-$i.txt 2>&1
  echo "load after: $(cat /proc/loadavg)" >> $OUT/tune-$i.txt
  cp "$(ls -t ~/.cache/ernie-chat/tune/*.json | head -1)" $OUT/tune-$i.json
done
