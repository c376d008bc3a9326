#!/usr/bin/env bash
# On the GPU machine: the cache server's GPU tier (issue 17) in one call. Its GPU test
# (cuda_gpu_tier_test: device-to-device fetches byte for byte, a fresh engine served from it
# exactly), gpu_tier_fetch_bench (64 MiB chunks over CUDA IPC against a device-to-device
# cudaMemcpy, and from host RAM over shared memory against a pinned copy), then the served
# Zipf trace twice through bench/run_tier_warmth.sh against one cache server on this host
# holding every document: with a GPU tier (warm fetches device to device) and without
# (warm fetches from host RAM), cold run first each time. Results: bench/results/gpu_tier_2026-11-27.md.
# usage: [VARIANTS="gpu_tier host_ram"] bench/run_gpu_tier_gpu.sh BUNDLE_DIR OUT_DIR
set -uo pipefail
bundle=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
source "$bundle/env.sh"
bin=$(dirname "$(command -v lazykv-worker)")
export LAZYKV_CACHE_SERVER=$bin/lazykv-cache-server
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
echo "== cuda_gpu_tier_test"
(cd /tmp && timeout 180 cuda_gpu_tier_test) > "$out/cuda_gpu_tier_test.txt" 2>&1
echo "rc=$?"
grep -E "^\[  (PASSED|FAILED) |OK \]|FAILED \]|Failure|warm engine" "$out/cuda_gpu_tier_test.txt"
echo "== gpu_tier_fetch_bench"
(cd /tmp && timeout 180 gpu_tier_fetch_bench --server "$bin/lazykv-cache-server" --chunks 6 --rounds 5) \
  > "$out/gpu_tier_fetch_bench.txt" 2>&1
echo "rc=$?"
grep -v "^\[" "$out/gpu_tier_fetch_bench.txt"
work=/tmp/gpu_tier_run
mkdir -p "$work"
trace=$work/trace.jsonl
lazykv-bench trace --docs 100 --docs-per-request 8 --zipf-s 1.1 --requests 160 --doc-lengths fixed:512 \
  --question-tokens 16 --max-tokens 64 --vocab 128000 --concurrency 64 --seed 1 --out "$trace"
model=(--model synthetic:llama3-8b --worker-arg --kv-pool --worker-arg 40GiB)
for variant in ${VARIANTS:-gpu_tier host_ram}; do
  echo "== warmth, one cache server on this host holding every document: $variant"
  args=""
  [[ $variant == gpu_tier ]] && args="--gpu-capacity 8GiB"
  CACHE_HOST_CAPACITY=12GiB CACHE_SERVER_ARGS="$args" timeout 240 "$bundle/data/run_tier_warmth.sh" "$bin" \
    "$work/warm_$variant" "$trace" remote "${model[@]}" 2>&1 | tee "$out/warm_$variant.txt" | cut -c1-400
  grep -h "GPU tier\|prefill calibration" "$work/warm_$variant"/*/worker-lazy.log | cut -c1-300 | head -8
done
# The logs in one file (the device tool brings back few files).
(cd "$work" && find . -name "*.log" -o -name "*.txt" | tar czf "$out/logs.tgz" -T -)
