#!/usr/bin/env bash
# On the GPU machine: the CUDA backend's GPU tests (and memcheck of the new ones; SKIP_TESTS=1
# skips both), the CLI on both devices, the prefill kernel against SDPA (PREFILL=1, when the
# bundle has cuda_prefill_bench), PyTorch's full-prefill TTFT of the same shape, and
# cuda_backend_bench (chunk import vs pinned memcpy; decode step; modes end to end; with
# BATCHED=1 also the trace under load through continuous batching).
# usage: bench/run_backend_gpu.sh BUNDLE_DIR [OUT_DIR]   (BUNDLE_DIR from bundle_backend_gpu.sh)
set -uo pipefail
bundle=$(cd "$1" && pwd)
out=${2:-${OUT:-/tmp/backend_out}}
mkdir -p "$out"
source "$bundle/env.sh"
export LAZYKV_MODELS_DIR=$BUNDLE_DATA
cd /tmp
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
tests="cuda_model_ops_test cuda_generic_attention_test cuda_backend_test cuda_chunk_transfer_test cuda_fp32_backend_test cuda_kernels_test
  cuda_prefill_test cuda_sampling_test cuda_output_layer_test cuda_warm_up_test cuda_sm_clock_test"
[[ ${SKIP_TESTS:-0} == 1 ]] && tests=""
for t in $tests; do
  timeout 150 "$t" > "$out/$t.log" 2>&1
  echo "$t rc=$?"
  grep -E "FAILED|Failure|request|stories|worst relative logit|PASSED" "$out/$t.log" | head -20
done
if [[ ${SANITIZE:-1} == 1 && -n $tests ]]; then
  for t in ${SANITIZE_TESTS:-cuda_backend_test cuda_prefill_test cuda_sampling_test cuda_output_layer_test}; do
    timeout 150 compute-sanitizer --tool memcheck "$t" > "$out/memcheck_$t.log" 2>&1
    echo "memcheck $t: $(grep -E 'ERROR SUMMARY' "$out/memcheck_$t.log")"
  done
fi
# The CLI on both devices: bf16 on cuda against the CPU (60 tokens), and fp32 on both (120).
for run in "cuda 60 auto" "cpu 60 auto" "cuda 120 fp32" "cpu 120 fp32"; do
  read -r device tokens dtype <<< "$run"
  timeout 60 lazykv run --device $device --dtype $dtype --no-cache-tier --model "$BUNDLE_DATA/stories260K.bin" \
    --tokenizer "$BUNDLE_DATA/tok512.bin" --doc "Lily had a red ball." --doc "Tom liked to run fast." \
    --prompt "One day" --max-tokens $tokens > "$out/cli_${device}_$dtype.txt" 2>&1
done
for dtype in auto fp32; do
  cmp -s <(grep -v '^\[20' "$out/cli_cuda_$dtype.txt" | sed 's/ttft=.*//') \
    <(grep -v '^\[20' "$out/cli_cpu_$dtype.txt" | sed 's/ttft=.*//') \
    && echo "lazykv run --dtype $dtype: same text on cuda and cpu" \
    || echo "lazykv run --dtype $dtype: texts differ (see cli_*_$dtype.txt)"
done
if [[ ${PREFILL:-1} == 1 ]] && command -v cuda_prefill_bench > /dev/null; then
  timeout 150 cuda_prefill_bench > "$out/prefill.log" 2>&1
  PYTHONUNBUFFERED=1 timeout 200 python3 "$BUNDLE_DATA/sdpa_prefill_reference.py" --prefill-log "$out/prefill.log" \
    2>&1 | tee "$out/sdpa.log" | sed -n '/prefill ratios/,/^decode\|^$/p'
fi
PYTHONUNBUFFERED=1 timeout 200 python3 "$BUNDLE_DATA/torch_prefill_reference.py" 2>&1 | tee "$out/torch.log"
timeout 300 cuda_backend_bench --e2e --requests ${REQUESTS:-100} --max-tokens ${MAX_TOKENS:-16} 2>&1 | tee "$out/bench.log"
if [[ ${BATCHED:-0} == 1 ]]; then
  timeout 400 cuda_backend_bench --e2e-batched --requests ${BATCHED_REQUESTS:-96} --max-tokens ${BATCHED_MAX_TOKENS:-64} \
    --out "$out/e2e_batched.json" 2>&1 | tee "$out/batched.log"
fi
