#!/usr/bin/env bash
# Issue 25, session 21, call 8: the rotation warps' query write with the rope style chosen outside its loop
# (h1_), and unrolled by two (h2_), against HEAD (head_): tests, then 8k / 16k full alternated.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for v in h1_ h2_; do
  timeout 100 ${v}cuda_prefill_test > $L/${v}test.log 2>&1; echo "${v} test rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/${v}test.log | tr '\n' ' ')"
done
for r in 1 2; do
  for len in 16384 8192; do
    for v in head_ h1_ h2_; do
      f=$L/${v}b${len}_$r.txt
      timeout 60 ${v}cuda_prefill_bench $len full > $f 2>&1
      echo "r$r $len $v: $(grep -E '^full ' $f | awk '{print "default", $8, "norot", $9, "rot", $10}') | backend bf16 $(grep -E "backend's launch, output in bf16" $f | sed -E 's/.*bf16: [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/') ${SECONDS}s"
    done
  done
done
xz -9 $L/*test.log
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
