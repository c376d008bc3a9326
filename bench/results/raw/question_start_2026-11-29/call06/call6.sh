#!/usr/bin/env bash
# Issue 25, session 22, call 6: the final code (one-tile work starts read with one call site) against main
# (d3a2c0a): tests; the questions table; the long-prefill rows alternated (the kernel's code changed:
# a regression check); the cached TTFT and the Zipf trace in process, alternated.
set -uo pipefail
bundle=$(cd pc-bundle && pwd)
source "$bundle/env.sh"
export LAZYKV_MODELS_DIR=$BUNDLE_DATA
logs=$OUT/logs; mkdir -p $logs
start=$(date +%s); el() { echo "$(($(date +%s) - start)) s"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; date -u
for t in cuda_prefill_test cuda_backend_test; do
  timeout 150 $t > $logs/$t.log 2>&1
  echo "$t rc=$? ($(el)): $(grep -E '^\[  (PASSED|FAILED)' $logs/$t.log | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure" $logs/$t.log | head -6
done
timeout 120 cuda_prefill_bench questions > $logs/questions.txt 2>&1; echo "questions rc=$? ($(el))"
grep -E "^ +[0-9]+ +4 |work starts made before" $logs/questions.txt
LAZYKV_PREFILL_TIMELINE_OUT=$logs/tl LAZYKV_PREFILL_TIMELINE_Q_ROTATED=1 timeout 120 tl_cuda_prefill_bench questions > $logs/tl_questions.txt 2>&1
cd $bundle/data && python3 prefill_short_ctas.py $logs/tl_questions_1 $logs/tl_questions_starts_1 > $logs/short_ctas.txt 2>&1
grep -E "==|work tile made|first tiles|waited|keys 0 ready|rows written|global" $logs/short_ctas.txt
cd - > /dev/null
for round in 1 2; do
  for len in 1024 4096 16384; do
    for v in main_ ""; do
      f=$logs/${v}bench_${len}_$round.log
      timeout 60 ${v}cuda_prefill_bench $len full > $f 2>&1
      l=$(grep -E "^full " $f | awk '{print $8, $9, $10}')
      s2=$(grep -E "schedule 2:" $f | sed -E 's/.*lazy [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/')
      bk=$(grep -E "backend's launch, output in bf16" $f | sed -E 's/.*bf16: [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/')
      echo "r$round $len ${v:-new_}: default lazy/norot/rot $l | one-tile $s2 | backend bf16 $bk"
    done
  done
done
for r in 1 2; do
  for v in main_ ""; do
    timeout 200 ${v}cuda_backend_bench > $logs/${v}backend_$r.txt 2>&1
    echo "r$r ${v:-new_} rc=$? ($(el)): $(grep -E '^TTFT' $logs/${v}backend_$r.txt | head -1)"
    timeout 100 ${v}cuda_backend_bench --e2e-batched --modes block,lazy --max-concurrency 64 > $logs/${v}e2e_$r.txt 2>&1
    echo "  e2e rc=$? ($(el))"; grep -E "^(block|lazy) +[0-9]" $logs/${v}e2e_$r.txt | head -2
  done
done
echo "done ($(el))"
xz -9 $logs/*_test.log
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $logs
