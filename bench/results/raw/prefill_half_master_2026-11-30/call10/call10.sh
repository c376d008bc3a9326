#!/usr/bin/env bash
# Issue 25, session 28, call 10: the engine's blocks for a document or question cut into pieces
# taken as one run at its first piece (spares), on the GPU backend: cuda_backend_test,
# cuda_warm_up_test and cuda_fp32_backend_test (lazy against block, the engine's tables on the GPU).
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for t in cuda_backend_test cuda_warm_up_test cuda_fp32_backend_test; do
  timeout 200 $t > $L/$t.log 2>&1
  echo "$t rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]" -A3 $L/$t.log | head -10
  xz -9 $L/$t.log
done
echo "done ${SECONDS}s"
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
