#!/usr/bin/env bash
# Issue 25, session 20, call 7: the final code (PrefillStepOrder moved to worker/backend/step_order.cc): the backend's tests.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
timeout 200 cuda_backend_test > $L/cuda_backend_test.log 2>&1; echo "cuda_backend_test rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/cuda_backend_test.log | tr '\n' ' ')"
grep -E "Failure|FAILED  \]|two prefill launches" $L/cuda_backend_test.log | head -12
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
