#!/usr/bin/env bash
# Issue 25, session 20, call 9: after the read-through (one tensor-map encoder for the query and output maps; the
# mixed table's two launches converted by their launcher): tests and the mixed table.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for t in cuda_prefill_test cuda_backend_test; do
  timeout 150 $t > $L/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]" $L/$t.log | head -8
done
timeout 60 cuda_prefill_bench mixed > $L/mixed.txt 2>&1; echo "mixed rc=$? ${SECONDS}s"; sed -n '/^mixed/,$p' $L/mixed.txt
timeout 40 cuda_prefill_bench 1024 full > $L/b1k.txt 2>&1; echo "1k rc=$? ${SECONDS}s"; grep -E "backend's launch, output" $L/b1k.txt | cut -c1-150
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
