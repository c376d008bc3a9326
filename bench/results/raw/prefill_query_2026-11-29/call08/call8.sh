#!/usr/bin/env bash
# Call 8: after review: the fence before each work tile's TMA in every rotation thread, the map built before any launch,
# the backend test's variants with the KV write's rotated query in every prefill step; tests and 1k against call 5's build.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for t in cuda_prefill_test cuda_backend_test; do
  timeout 200 $t > $L/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]|query rotated|tokens equal" $L/$t.log | head -12
done
for r in 1 2; do for b in "" tma_; do
  timeout 60 ${b}cuda_prefill_bench 1024 full > $L/${b}bench_1024_full_$r.txt 2>&1; echo "${b}bench 1024 r=$r rc=$? ${SECONDS}s"
  grep -E "^full|schedule 3 with work starts, q" $L/${b}bench_1024_full_$r.txt | cut -c1-150
done; done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
