#!/usr/bin/env bash
# Issue 25, session 20, call 6: the final code: tests; every prefill table; SDPA in the same call.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for t in cuda_backend_test cuda_prefill_test cuda_model_ops_test; do
  timeout 200 $t > $L/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]|two prefill launches" $L/$t.log | head -12
done
timeout 150 cuda_prefill_bench > $L/cuda_prefill_bench.log 2>&1; echo "bench rc=$? ${SECONDS}s"
grep -E "^(full|last) |backend's launch, output|persistent kernel, q rotated" $L/cuda_prefill_bench.log | cut -c1-220
sed -n '/^mixed/,$p' $L/cuda_prefill_bench.log
timeout 200 python3 pc-bundle/data/sdpa_prefill_reference.py --prefill-log $L/cuda_prefill_bench.log > $L/sdpa.log 2>&1
echo "SDPA rc=$? ${SECONDS}s"; sed -n '/prefill ratios/,$p' $L/sdpa.log | head -14; grep -iE "matmul|ceiling" $L/sdpa.log | head -3
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
