#!/usr/bin/env bash
# The skinny GEMM on the GPU machine: the tests whose products it now runs, then
# cuda_backend_bench (transfer and decode ceilings) with cuBLASLt only and with the skinny
# kernel, in one call.
# Here (the bundle must stay under the 64 MiB a call carries with the tree):
#   LAZYKV_MODELS_DIR=../shared/models bash bench/bundle_backend_gpu.sh OUT build cuda_skinny_gemm_test \
#     cuda_backend_test cuda_warm_up_test cuda_backend_bench && cp bench/run_skinny_gemm_gpu.sh OUT/data/
# There: bash OUT/data/run_skinny_gemm_gpu.sh OUT LOGDIR. Tests not in the bundle are skipped
# (cuda_model_ops_test, cuda_output_layer_test and cuda_gpu_tier_test also run its products).
set -uo pipefail
bundle=$1; out=$2; mkdir -p "$out"
source "$bundle/env.sh"
export LAZYKV_MODELS_DIR=$bundle/data LAZYKV_CACHE_SERVER=$(command -v lazykv-cache-server)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/device.txt"
status=0
for t in cuda_skinny_gemm_test cuda_backend_test cuda_warm_up_test cuda_model_ops_test cuda_output_layer_test \
         cuda_gpu_tier_test; do
  command -v "$t" > /dev/null || { echo "$t: not in the bundle, skipped"; continue; }
  $t > "$out/$t.log" 2>&1 || status=1
  echo "$t: $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "$out/$t.log" | tr '\n' ' ')"
done
cuda_backend_bench --no-skinny-gemm > "$out/bench_cublaslt.txt" 2>&1 || status=1
cuda_backend_bench > "$out/bench_skinny.txt" 2>&1 || status=1
grep -hE "decode step|a step's GEMMs" "$out"/bench_cublaslt.txt "$out"/bench_skinny.txt
exit $status
