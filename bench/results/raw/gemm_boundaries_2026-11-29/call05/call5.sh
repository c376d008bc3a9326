#!/usr/bin/env bash
# Issue 25, session 23, call 5: the tensor-core skinny GEMM with a deeper pipeline where its grid
# leaves at most 2 or 3 CTAs an SM (8 or 6 stages in dynamic shared memory; LAZYKV_SKINNY_MMA_DEEP,
# on by default): tests and memcheck, then the TTFT, the GEMM table and the decode step alternated
# on/off (two rounds), the TTFT step's kernel trace both ways, and the served trace both ways.
set -uo pipefail
bundle=$(cd pc-bundle && pwd)
source "$bundle/env.sh"
export LAZYKV_MODELS_DIR=$BUNDLE_DATA
logs=$OUT/logs; mkdir -p $logs
start=$(date +%s); el() { echo "$(($(date +%s) - start)) s"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
for t in cuda_skinny_mma_gemm_test cuda_backend_test; do
  timeout 200 $t > $logs/$t.log 2>&1
  echo "$t rc=$? ($(el)): $(grep -E '^\[  (PASSED|FAILED)' $logs/$t.log | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure|differs" $logs/$t.log | head -6
done
cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
timeout 150 $cs --tool memcheck cuda_skinny_mma_gemm_test --gtest_filter='*Depths*' > $logs/memcheck.log 2>&1
echo "memcheck rc=$? ($(el)): $(grep -E 'ERROR SUMMARY|PASSED|FAILED' $logs/memcheck.log | tr '\n' ' ')"
run() {  # name, env...
  local name=$1; shift
  env "$@" timeout 200 cuda_backend_bench > $logs/backend_$name.txt 2>&1
  echo "$name rc=$? ($(el)): $(grep -E '^TTFT' $logs/backend_$name.txt | head -1 | sed 's/TTFT with all 8 documents cached, 16-token question, batch 1: //') | decode $(grep -E '^decode step' $logs/backend_$name.txt | head -1 | sed 's/decode step, batch 1, context ~4.1k: //' | cut -c1-12)"
  grep -E "tensor-core skinny kernel" $logs/backend_$name.txt | sed -n '1p;4p;12p' | cut -c1-90
}
for r in 1 2; do
  run on_$r LAZYKV_SKINNY_MMA_DEEP=1
  run off_$r LAZYKV_SKINNY_MMA_DEEP=0
done
for s in 1 0; do
  LAZYKV_SKINNY_MMA_DEEP=$s timeout 200 cuda_backend_bench --kernel-trace > $logs/trace_$s.txt 2>&1
  echo "trace deep=$s rc=$? ($(el))"
  sed -n '/the TTFT step/,/^$/p' $logs/trace_$s.txt | sed -n '3,4p'
done
bin=$(dirname "$(command -v lazykv-worker)")
trace=/tmp/trace_c1.jsonl
lazykv-bench trace --docs 100 --docs-per-request 8 --zipf-s 1.1 --requests 60 --doc-lengths fixed:512 \
  --question-tokens 16 --max-tokens 16 --vocab 128000 --concurrency 1 --seed 1 --out "$trace" > /dev/null
for r in 1 2; do
  for s in 1 0; do
    (cd /tmp && LAZYKV_SKINNY_MMA_DEEP=$s timeout 200 lazykv-bench compare --worker "$bin/lazykv-worker" --trace "$trace" --modes lazy \
      --model synthetic:llama3-8b --worker-arg --kv-pool --worker-arg 20GiB --worker-arg --no-cache-tier \
      --out-dir "$logs/served_${s}_$r" > "$logs/served_${s}_$r.txt" 2>&1)
    echo "served deep=$s r$r rc=$? ($(el)): $(grep -E '^lazy ' $logs/served_${s}_$r.txt | head -2 | tr -s ' ' | tr '\n' ' ' | cut -c1-200)"
    find "$logs/served_${s}_$r" -type f ! -name compare.json -delete
  done
done
echo "done ($(el))"
xz -9 $logs/*_test.log $logs/memcheck.log 2>/dev/null
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $logs
