#!/usr/bin/env bash
# Issue 25, session 23, call 1: the output GEMM's weights asked of L2 during a few-row step's
# attention (LAZYKV_L2_PREFETCH, on by default; LAZYKV_L2_PREFETCH_MB caps it): tests, then the
# TTFT and batch-1 decode step alternated on/off/capped (two rounds), the TTFT step's kernel
# trace both ways, and the served trace at concurrency 1 both ways.
set -uo pipefail
bundle=$(cd pc-bundle && pwd)
source "$bundle/env.sh"
export LAZYKV_MODELS_DIR=$BUNDLE_DATA
logs=$OUT/logs; mkdir -p $logs
start=$(date +%s); el() { echo "$(($(date +%s) - start)) s"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; date -u
for t in cuda_backend_test; do
  timeout 150 $t > $logs/$t.log 2>&1
  echo "$t rc=$? ($(el)): $(grep -E '^\[  (PASSED|FAILED)' $logs/$t.log | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure" $logs/$t.log | head -6
done
run() {  # name, env...
  local name=$1; shift
  env "$@" timeout 200 cuda_backend_bench > $logs/backend_$name.txt 2>&1
  echo "$name rc=$? ($(el)): $(grep -E '^TTFT' $logs/backend_$name.txt | head -1 | sed 's/TTFT with all 8 documents cached, 16-token question, batch 1: //') | $(grep -E '^decode step' $logs/backend_$name.txt | head -1 | sed 's/decode step, batch 1, context ~4.1k: //')"
}
for r in 1 2; do
  run on_$r LAZYKV_L2_PREFETCH=1
  run off_$r LAZYKV_L2_PREFETCH=0
  run mb16_$r LAZYKV_L2_PREFETCH_MB=16
  run mb24_$r LAZYKV_L2_PREFETCH_MB=24
done
for s in 1 0; do
  LAZYKV_L2_PREFETCH=$s timeout 200 cuda_backend_bench --kernel-trace > $logs/trace_$s.txt 2>&1
  echo "trace prefetch=$s rc=$? ($(el))"
  sed -n '/the TTFT step/,/^$/p' $logs/trace_$s.txt | head -18
  sed -n '/kernel trace: decode steps/,/^$/p' $logs/trace_$s.txt | head -8
done
bin=$(dirname "$(command -v lazykv-worker)")
trace=/tmp/trace_c1.jsonl
lazykv-bench trace --docs 100 --docs-per-request 8 --zipf-s 1.1 --requests 60 --doc-lengths fixed:512 \
  --question-tokens 16 --max-tokens 16 --vocab 128000 --concurrency 1 --seed 1 --out "$trace" > /dev/null
for r in 1 2; do
  for s in 1 0; do
    (cd /tmp && LAZYKV_L2_PREFETCH=$s timeout 200 lazykv-bench compare --worker "$bin/lazykv-worker" --trace "$trace" --modes lazy \
      --model synthetic:llama3-8b --worker-arg --kv-pool --worker-arg 20GiB --worker-arg --no-cache-tier \
      --out-dir "$logs/served_${s}_$r" > "$logs/served_${s}_$r.txt" 2>&1)
    echo "served prefetch=$s r$r rc=$? ($(el)): $(grep -E '^lazy ' $logs/served_${s}_$r.txt | head -2 | tr -s ' ' | tr '\n' ' ')"
    find "$logs/served_${s}_$r" -name "*.jsonl" -size +256k -delete
  done
done
echo "done ($(el))"
xz -9 $logs/*_test.log
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $logs
