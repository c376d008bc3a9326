#!/usr/bin/env bash
# Issue 25's TTFT with every document cached, on the GPU machine, in one call:
#  - the GPU tests named in TESTS (default: the prefill kernel's, whose packed tiles this
#    measures, and the transfer and decode paths' regression tests), those not bundled skipped;
#  - cuda_prefill_bench: its questions table (8 cached documents, a 16-token question, the
#    heads of a KV group packed into a tile against one tile per head, and the KV read floor);
#  - cuda_backend_bench: the batch-1 TTFT with all 8 documents cached against one weight pass
#    (and the transfer and decode ceilings);
#  - the Zipf trace under load in process (--e2e-batched, block and lazy, concurrency 64),
#    with packing and with --no-prefill-pack: TTFT p50 by cached documents;
#  - the data-path issue's served trace at concurrency 1 through lazykv-worker (TTFT p50 by
#    cached documents).
# Here: LAZYKV_MODELS_DIR=../shared/models bash bench/bundle_backend_gpu.sh OUT build cuda_prefill_test \
#   cuda_prefill_bench cuda_backend_bench lazykv-worker lazykv-bench [more tests] && cp bench/run_cached_ttft_gpu.sh OUT/data/
# There: bash OUT/data/run_cached_ttft_gpu.sh OUT LOGDIR   (SERVED=0 or E2E=0 leave those parts out)
# The logs come back as LOGDIR/logs.tar.xz (a call returns at most 8 files); stdout has the summary.
set -uo pipefail
bundle=$1; out=$2
logs=$out/logs
mkdir -p "$logs"
source "$bundle/env.sh"
export LAZYKV_MODELS_DIR=$bundle/data
command -v lazykv-cache-server > /dev/null && export LAZYKV_CACHE_SERVER=$(command -v lazykv-cache-server)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$logs/device.txt"
status=0
for t in ${TESTS:-cuda_prefill_test cuda_piece_copy_test cuda_chunk_transfer_test cuda_backend_test \
                  cuda_skinny_gemm_test cuda_warm_up_test}; do
  command -v "$t" > /dev/null || { echo "$t: not in the bundle, skipped"; continue; }
  timeout 300 "$t" > "$logs/$t.log" 2>&1 || status=1
  echo "$t: $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "$logs/$t.log" | tr '\n' ' ')"
done
timeout 300 cuda_prefill_bench > "$logs/cuda_prefill_bench.txt" 2>&1 || status=1
sed -n '/^questions/,$p' "$logs/cuda_prefill_bench.txt"
grep -E "^(full|last) " "$logs/cuda_prefill_bench.txt"
timeout 300 cuda_backend_bench > "$logs/cuda_backend_bench.txt" 2>&1 || status=1
grep -E "^TTFT|^decode step|^import|^export" "$logs/cuda_backend_bench.txt"
if [[ ${E2E:-1} == 1 ]]; then
  for pack in on off; do
    flag=; [[ $pack == off ]] && flag=--no-prefill-pack
    timeout 400 cuda_backend_bench --e2e-batched --modes block,lazy --max-concurrency 64 $flag \
      --out "$logs/e2e_pack_$pack.json" > "$logs/e2e_pack_$pack.txt" 2>&1 || status=1
    echo "== e2e batched, concurrency 64, prefill pack $pack"
    grep -vE "^\s*$" "$logs/e2e_pack_$pack.txt" | tail -n 14
  done
fi
if [[ ${SERVED:-1} == 1 ]] && command -v lazykv-worker > /dev/null; then
  bin=$(dirname "$(command -v lazykv-worker)")
  trace=/tmp/trace_c1.jsonl
  lazykv-bench trace --docs 100 --docs-per-request 8 --zipf-s 1.1 --requests 48 --doc-lengths fixed:512 \
    --question-tokens 16 --max-tokens 16 --vocab 128000 --concurrency 1 --seed 1 --out "$trace"
  (cd /tmp && timeout 300 lazykv-bench compare --worker "$bin/lazykv-worker" --trace "$trace" --modes lazy \
    --model synthetic:llama3-8b --worker-arg --kv-pool --worker-arg 20GiB --worker-arg --no-cache-tier \
    --out-dir "$logs/served_c1" > "$logs/served_c1.txt" 2>&1) || status=1
  echo "== served, concurrency 1"
  grep -E -A3 "^mode|by cached|TTFT p50 by" "$logs/served_c1.txt" | head -n 20
  find "$logs/served_c1" -name "*.jsonl" -size +256k -delete
fi
tar -C "$out" -cJf "$out/logs.tar.xz" logs && rm -rf "$logs"
exit $status
