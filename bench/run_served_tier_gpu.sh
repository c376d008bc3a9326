#!/usr/bin/env bash
# On the GPU machine: the served path with the cache tier, the data-path issue's run.
# A Zipf RAG trace with synthetic:llama3-8b through lazykv-worker (lazykv-bench compare),
# lazy and block: with the default embedded tier (cold), with --no-cache-tier, and the
# in-process engine under the same load (cuda_backend_bench --e2e-batched); then a fresh
# worker against the warm embedded tier and against a warm cache server over gRPC
# (bench/run_tier_warmth.sh), which show which way fetch-or-recompute went.
# usage: bench/run_served_tier_gpu.sh BUNDLE_DIR OUT_DIR [PARTS]
#   PARTS: any of "served inproc warm remote remote_hot remote_rate remote_hot_rate shm" (remote_hot:
#   the cache server's host RAM holds every chunk of the trace; *_rate: the same trace with open-loop
#   Poisson arrivals at 20 requests/s instead of 64 in flight, whose TTFT is not shaped by waves
#   of requests finishing together; shm: shm_fetch_bench --device, same-host fetches to the GPU)
set -uo pipefail
bundle=$(cd "$1" && pwd)
out=$2
parts=${3:-served inproc warm remote}
mkdir -p "$out"
source "$bundle/env.sh"
bin=$(dirname "$(command -v lazykv-worker)")
cd /tmp
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
trace=$out/trace.jsonl
lazykv-bench trace --docs 100 --docs-per-request 8 --zipf-s 1.1 --requests 160 --doc-lengths fixed:512 \
  --question-tokens 16 --max-tokens 64 --vocab 128000 --concurrency 64 --seed 1 --out "$trace"
# The same requests arriving open-loop (Poisson, 20 per second: below both runs' capacity).
rate_trace=$out/trace_rate20.jsonl
lazykv-bench trace --docs 100 --docs-per-request 8 --zipf-s 1.1 --requests 160 --doc-lengths fixed:512 \
  --question-tokens 16 --max-tokens 64 --vocab 128000 --rate 20 --seed 1 --out "$rate_trace"
model=(--model synthetic:llama3-8b --worker-arg --kv-pool --worker-arg 50GiB)
run() {  # name, then lazykv-bench compare arguments
  local name=$1
  shift
  echo "== $name"
  timeout 300 lazykv-bench compare --worker "$bin/lazykv-worker" --trace "$trace" --modes lazy,block "${model[@]}" \
    "$@" --out-dir "$out/$name" > "$out/$name.txt" 2>&1
  echo "rc=$?"
  grep -A6 "^mode" "$out/$name.txt"
  grep -h "steps:\|chunk pipeline:\|fetch cost\|prefill cost\|backend:\|backend warm-up" "$out/$name"/worker-*.log
}
for part in $parts; do
  case $part in
    served)
      run default_tier
      run no_cache_tier --worker-arg --no-cache-tier
      ;;
    inproc)
      echo "== in-process"
      timeout 300 cuda_backend_bench --e2e-batched --requests 160 --max-tokens 64 --max-concurrency 64 \
        --modes block,lazy --out "$out/inproc.json" > "$out/inproc.txt" 2>&1
      echo "rc=$?"
      grep -E -A3 "req/s" "$out/inproc.txt" | head -n 12; tail -n 8 "$out/inproc.txt"
      ;;
    warm)
      echo "== warmth, embedded tier (defaults: host 256MiB, disk 2GiB)"
      timeout 300 "$BUNDLE_DATA/run_tier_warmth.sh" "$bin" "$out/warm_embedded" "$trace" embedded "${model[@]}"
      echo "== warmth, embedded tier with 8GiB of host RAM"
      timeout 300 "$BUNDLE_DATA/run_tier_warmth.sh" "$bin" "$out/warm_embedded_host" "$trace" embedded "${model[@]}" \
        --worker-arg --cache-host-capacity --worker-arg 8GiB --worker-arg --cache-disk-capacity --worker-arg 8GiB
      grep -h "steps:\|chunk pipeline:\|fetch cost\|prefill cost" "$out"/warm_embedded*/*/worker-lazy.log
      ;;
    remote)
      echo "== warmth, one cache server on this host (shared memory)"
      timeout 300 "$BUNDLE_DATA/run_tier_warmth.sh" "$bin" "$out/warm_remote" "$trace" remote "${model[@]}"
      grep -h "steps:\|chunk pipeline:\|fetch cost\|prefill cost\|prefill calibration" "$out"/warm_remote/*/worker-lazy.log
      ;;
    remote_hot)
      echo "== warmth, one cache server on this host (shared memory) holding the whole trace in RAM"
      CACHE_HOST_CAPACITY=12GiB timeout 300 "$BUNDLE_DATA/run_tier_warmth.sh" "$bin" "$out/warm_remote_hot" "$trace" \
        remote "${model[@]}"
      grep -h "steps:\|chunk pipeline:\|fetch cost\|prefill cost\|prefill calibration" "$out"/warm_remote_hot/*/worker-lazy.log
      ;;
    remote_rate | remote_hot_rate)
      capacity=4GiB
      [[ $part == remote_hot_rate ]] && capacity=12GiB
      echo "== warmth at 20 requests/s open-loop, one cache server on this host with $capacity of host RAM"
      CACHE_HOST_CAPACITY=$capacity timeout 300 "$BUNDLE_DATA/run_tier_warmth.sh" "$bin" "$out/warm_$part" \
        "$rate_trace" remote "${model[@]}"
      ;;
    shm)
      echo "== same-host fetch to the GPU: shm_fetch_bench --device"
      timeout 300 shm_fetch_bench --device --server "$bin/lazykv-cache-server" --chunks 6 --rounds 5 \
        > "$out/shm_fetch_device.txt" 2>&1
      echo "rc=$?"
      grep -v "^\[" "$out/shm_fetch_device.txt"
      ;;
  esac
done
