#!/usr/bin/env bash
# Issue 25, session 22, call 4: the one-tile kernel's CTAs read their first tiles from work starts
# (made once a step) instead of searching their split's entry range. Tests; the questions table (walking
# against reading); the timeline of both; the in-process cached TTFT with LAZYKV_PREFILL_WORK_STARTS=1 / 0,
# alternated.
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
sed -n '/^questions/,$p' $logs/questions.txt | head -24
LAZYKV_PREFILL_TIMELINE_OUT=$logs/tl LAZYKV_PREFILL_TIMELINE_Q_ROTATED=1 timeout 120 tl_cuda_prefill_bench questions > $logs/tl_questions.txt 2>&1
echo "timeline rc=$? ($(el))"
cd $bundle/data && python3 prefill_short_ctas.py $logs/tl_questions_1 $logs/tl_questions_starts_1 2>&1 | tee $logs/short_ctas.txt
cd - > /dev/null
for r in 1 2; do
  for s in 1 0; do
    LAZYKV_PREFILL_WORK_STARTS=$s timeout 200 cuda_backend_bench > $logs/backend_${s}_$r.txt 2>&1
    echo "r$r starts=$s rc=$? ($(el)): $(grep -E '^TTFT' $logs/backend_${s}_$r.txt | head -2 | tr '\n' ' ')"
    grep -E "^decode step" $logs/backend_${s}_$r.txt | head -2
  done
done
echo "done ($(el))"
xz -9 $logs/*_test.log
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $logs
