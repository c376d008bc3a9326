#!/usr/bin/env bash
# Issue 25, session 22, call 5: call 4's build with the test fixes (the flaky 25-work-tile expectation;
# the starts' bytes now also the one-tile CTAs'; LAZYKV_TEST_SEED), the failing seed run again; the
# questions timeline with more prologue stamps; the TTFT A/B (LAZYKV_PREFILL_WORK_STARTS) again, and
# the TTFT step's kernel trace with and without starts.
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
grep -E "^persistent from" $logs/cuda_backend_test.log
LAZYKV_TEST_SEED=13616638383853222509 timeout 150 cuda_backend_test --gtest_filter='*FewQuery*' > $logs/seed.log 2>&1
echo "seed 13616638383853222509 rc=$?: $(grep -E '^persistent from' $logs/seed.log | tr '\n' ' ')"
LAZYKV_PREFILL_TIMELINE_OUT=$logs/tl LAZYKV_PREFILL_TIMELINE_Q_ROTATED=1 timeout 120 tl_cuda_prefill_bench questions > $logs/tl_questions.txt 2>&1
echo "timeline rc=$? ($(el))"
cd $bundle/data && python3 prefill_short_ctas.py $logs/tl_questions_1 $logs/tl_questions_starts_1 2>&1 | tee $logs/short_ctas.txt | grep -vE "copy: (key|value)|c0: (scores|first half)"
cd - > /dev/null
for r in 1 2; do
  for s in 1 0; do
    LAZYKV_PREFILL_WORK_STARTS=$s timeout 200 cuda_backend_bench > $logs/backend_${s}_$r.txt 2>&1
    echo "r$r starts=$s rc=$? ($(el)): $(grep -E '^TTFT' $logs/backend_${s}_$r.txt | head -1)"
  done
done
for s in 1 0; do
  LAZYKV_PREFILL_WORK_STARTS=$s timeout 200 cuda_backend_bench --kernel-trace > $logs/trace_$s.txt 2>&1
  echo "trace starts=$s rc=$? ($(el))"
  sed -n '/the TTFT step/,/^$/p' $logs/trace_$s.txt | head -30
done
echo "done ($(el))"
xz -9 $logs/*_test.log
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $logs
