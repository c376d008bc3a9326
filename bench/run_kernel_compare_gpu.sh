#!/usr/bin/env bash
# On the GPU machine, after a kernel refactor that must not change behaviour: every GPU
# test, compute-sanitizer memcheck of the changed kernels' tests, and the decode and prefill
# kernel benchmarks of this build against a baseline build's (old_cuda_decode_bench,
# old_cuda_prefill_bench copied into the bundle's bin/), alternated new/old/new/old.
# usage: bench/run_kernel_compare_gpu.sh BUNDLE_DIR [OUT_DIR]
set -uo pipefail
bundle=$(cd "$1" && pwd)
out=${2:-${OUT:-/tmp/kernel_compare}}
mkdir -p "$out"
source "$bundle/env.sh"
export LAZYKV_MODELS_DIR=$BUNDLE_DATA
cd /tmp
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
tests=${TESTS-"cuda_model_ops_test cuda_generic_attention_test cuda_backend_test cuda_chunk_transfer_test cuda_fp32_backend_test cuda_kernels_test
  cuda_prefill_test cuda_sampling_test cuda_output_layer_test"}
{
for t in $tests; do
  timeout 200 "$t" > "$out/$t.log" 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$out/$t.log" | tr '\n' ' ')"
done
for t in ${SANITIZE_TESTS-cuda_prefill_test cuda_kernels_test cuda_model_ops_test}; do
  timeout 200 compute-sanitizer --tool memcheck "$t" > "$out/memcheck_$t.log" 2>&1
  echo "memcheck $t: $(grep -E 'ERROR SUMMARY' "$out/memcheck_$t.log")"
done
} > "$out/tests.txt" 2>&1
cat "$out/tests.txt"
for round in 1 2; do
  timeout 120 cuda_decode_bench > "$out/decode_new_$round.log" 2>&1; echo "decode new $round rc=$?"
  timeout 120 old_cuda_decode_bench > "$out/decode_old_$round.log" 2>&1; echo "decode old $round rc=$?"
  timeout 150 cuda_prefill_bench > "$out/prefill_new_$round.log" 2>&1; echo "prefill new $round rc=$?"
  timeout 150 old_cuda_prefill_bench > "$out/prefill_old_$round.log" 2>&1; echo "prefill old $round rc=$?"
done
# Few files come back from the device: every log in one archive.
tar -C "$out" -czf "$out/logs.tgz" --exclude=logs.tgz --exclude=tests.txt . 2>/dev/null && rm -f "$out"/*.log
