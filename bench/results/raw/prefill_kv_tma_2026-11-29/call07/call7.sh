#!/usr/bin/env bash
# Issue 25, session 27, call 7 (probe): how the one-tile kernel's rotation warps wait for a query
# buffer (LAZYKV_PREFILL_ROTATION_WAIT: 0 spin; N > 0 sleep between tests, backoff to N ns; -N a
# suspend-time hint of N ns), with the TMA copies: rotation cost and TFLOP/s at 16k and 4k, alternated.
set -u
source pc-bundle/env.sh
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for mode in 256 -20000; do
  LAZYKV_PREFILL_ROTATION_WAIT=$mode timeout 200 cuda_prefill_test --gtest_filter='*llama3_rag*:*own_keys*' > $L/test_$mode.log 2>&1
  echo "cuda_prefill_test wait=$mode rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/test_$mode.log | tr '\n' ' ')"
done
row() { echo "$(grep -E '^full ' $1 | awk '{print "default", $8, "norot", $9, "rot", $10}') | one-tile $(grep -E 'schedule 2:' $1 | sed -E 's/.*lazy [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/' | head -1)"; }
for r in 1 2; do
  for len in 16384 4096; do
    for mode in 0 256 1024 -20000; do
      f=$L/w${mode}_b${len}_$r.txt
      LAZYKV_PREFILL_ROTATION_WAIT=$mode timeout 60 cuda_prefill_bench $len full > $f 2>&1
      echo "r$r $len wait=$mode rc=$?: $(row $f)"
    done
  done
done
echo "done ${SECONDS}s"
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
