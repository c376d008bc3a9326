#!/usr/bin/env bash
# Issue 25, session 22, call 9: after the review's fixes (contracts, the timeline's own starts, the tests'
# split counts, a split one-tile run with starts, the 25-work-tile bound): tests, the questions table and
# its timelines, the mixed table.
set -uo pipefail
bundle=$(cd pc-bundle && pwd)
source "$bundle/env.sh"
export LAZYKV_MODELS_DIR=$BUNDLE_DATA
logs=$OUT/logs; mkdir -p $logs
start=$(date +%s); el() { echo "$(($(date +%s) - start)) s"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
for t in cuda_prefill_test cuda_backend_test; do
  timeout 150 $t > $logs/$t.log 2>&1
  echo "$t rc=$? ($(el)): $(grep -E '^\[  (PASSED|FAILED)' $logs/$t.log | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure" $logs/$t.log | head -6
done
grep -E "^persistent from" $logs/cuda_backend_test.log
timeout 120 cuda_prefill_bench questions > $logs/questions.txt 2>&1; echo "questions rc=$? ($(el))"
grep -E "^ +[0-9]+ +4 |work starts made before" $logs/questions.txt
timeout 120 cuda_prefill_bench mixed > $logs/mixed.txt 2>&1; echo "mixed rc=$? ($(el))"; sed -n '/^mixed/,$p' $logs/mixed.txt | head -14
LAZYKV_PREFILL_TIMELINE_OUT=$logs/tl LAZYKV_PREFILL_TIMELINE_Q_ROTATED=1 timeout 120 tl_cuda_prefill_bench questions > $logs/tl_questions.txt 2>&1
cd $bundle/data && python3 prefill_short_ctas.py $logs/tl_questions_1 $logs/tl_questions_starts_1 > $logs/short_ctas.txt 2>&1
grep -E "==|work tile made|first tiles|waited|keys 0 ready|rows written|global" $logs/short_ctas.txt
rm -f $logs/tl_questions_[0-9]* $logs/tl_questions_starts_[0-9]*
echo "done ($(el))"
xz -9 $logs/*_test.log
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $logs
