#!/usr/bin/env bash
# Call 2: the split norm with the next kernel let in early (LAZYKV_MMA_EARLY_NEXT), alternated; traces.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
timeout 100 cuda_split_norm_test > $L/split_norm_test.log 2>&1; echo "split_norm_test rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/split_norm_test.log | tr '\n' ' ')"
LAZYKV_MMA_EARLY_NEXT=2 timeout 200 cuda_backend_test > $L/backend_test_e2.log 2>&1; echo "backend_test early=2 rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/backend_test_e2.log | tr '\n' ' ')"
for r in 1 2; do for v in s0e0 s1e0 s1e1 s1e2 s0e2; do
  LAZYKV_SPLIT_NORM=${v:1:1} LAZYKV_MMA_EARLY_NEXT=${v:3:1} timeout 150 cuda_backend_bench > $L/backend_${v}_$r.txt 2>&1; echo "backend $v r=$r rc=$? ${SECONDS}s"
  grep -E "^TTFT|^decode step" $L/backend_${v}_$r.txt | cut -c1-150
done; done
for v in s0e0 s1e1; do
  LAZYKV_SPLIT_NORM=${v:1:1} LAZYKV_MMA_EARLY_NEXT=${v:3:1} timeout 150 cuda_backend_bench --kernel-trace > $L/trace_${v}.txt 2>&1; echo "trace $v rc=$? ${SECONDS}s"
  sed -n '/TTFT step/,/per step/p' $L/trace_${v}.txt
done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
