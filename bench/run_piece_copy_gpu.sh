#!/usr/bin/env bash
# The piece copy kernel on the GPU machine: its tests and the chunk transfer's, then the
# benchmarks (piece_copy_bench; cuda_backend_bench's transfer part twice; the same-host
# fetch benchmarks with the kernel and with the copy engines only, alternated).
# Here: LAZYKV_MODELS_DIR=../shared/models bash bench/bundle_backend_gpu.sh OUT build \
#   cuda_piece_copy_test cuda_chunk_transfer_test cuda_finite_check_test cuda_gpu_tier_test piece_copy_bench \
#   cuda_backend_bench gpu_tier_fetch_bench shm_fetch_bench lazykv-cache-server && cp bench/run_piece_copy_gpu.sh OUT/data/
# There: bash OUT/data/run_piece_copy_gpu.sh OUT LOGDIR
set -uo pipefail
bundle=$1; out=$2; mkdir -p "$out"
source "$bundle/env.sh"
server=$(command -v lazykv-cache-server)
export LAZYKV_CACHE_SERVER=$server
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/device.txt"
status=0
for t in cuda_piece_copy_test cuda_finite_check_test cuda_chunk_transfer_test cuda_gpu_tier_test; do
  $t > "$out/$t.log" 2>&1 || status=1
  echo "$t: $(grep -cE '^\[       OK \]' "$out/$t.log") passed, $(grep -cE '^\[  FAILED  \]' "$out/$t.log") failed lines"
done
piece_copy_bench --reps 30 > "$out/piece_copy_bench.txt" 2>&1 || status=1
for i in 1 2; do cuda_backend_bench > "$out/cuda_backend_bench_transfer_$i.txt" 2>&1 || status=1; done
for i in 1 2; do
  for mode in kernel engines; do
    flag=; [[ $mode == engines ]] && flag=--copy-engines
    shm_fetch_bench --server "$server" --chunks 6 --chunk-bytes 64MiB --rounds 5 --device $flag \
      > "$out/shm_fetch_${mode}_$i.txt" 2>&1 || status=1
    gpu_tier_fetch_bench --server "$server" --chunks 6 --rounds 5 $flag > "$out/gpu_tier_fetch_${mode}_$i.txt" 2>&1 || status=1
  done
done
grep -hE "^import|^export|paired|streamed|pinned cudaMemcpy" "$out"/cuda_backend_bench_transfer_*.txt
grep -E "backend path|its plan|32 CTAs x 1024|batched|ceiling|kernel \+ check:" "$out/piece_copy_bench.txt"
for f in "$out"/shm_fetch_*.txt; do echo "== $(basename "$f")"; grep -E "^shm|^pinned" "$f"; done
for f in "$out"/gpu_tier_fetch_*.txt; do echo "== $(basename "$f")"; grep -E "^cuda_ipc|of which|^shm|^d2d|^pinned" "$f"; done
exit $status
