#!/usr/bin/env bash
# Issue 25, session 21, call 5: the one-tile kernel writes the bf16 output itself (unsplit); a long prefill
# takes the persistent kernel only up to 8192 keys. Tests; the whole prefill table (now with 8k) and the
# default launch at 16k against main alternated; backend tests.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for t in cuda_prefill_test cuda_backend_test; do
  timeout 150 $t > $L/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]" -A4 $L/$t.log | head -16
done
timeout 150 cuda_prefill_bench > $L/bench_all.txt 2>&1; echo "whole table rc=$? ${SECONDS}s"
grep -E "^(full|last) |backend's launch, output|persistent kernel, q rotated" $L/bench_all.txt | cut -c1-200
for r in 1 2; do
  for len in 8192 16384; do
    for v in main_ ""; do
      f=$L/${v}b${len}_$r.txt
      timeout 60 ${v}cuda_prefill_bench $len full > $f 2>&1
      echo "r$r $len ${v:-new_}: $(grep -E '^full ' $f | awk '{print "default", $8, "norot", $9, "rot", $10}') | backend bf16 $(grep -E "backend's launch, output in bf16" $f | sed -E 's/.*bf16: [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/') | $(grep -E 'persistent kernel, q rotated' $f | sed -E 's/.*rotated: [0-9.]+ ms, ([0-9.]+) TFLOP.*kernel[:,][^0-9]*[0-9.]+ ms, ([0-9.]+) TFLOP.*/pers \1 one-tile \2/')"
    done
  done
done
xz -9 $L/cuda_prefill_test.log $L/cuda_backend_test.log
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
