#!/usr/bin/env bash
# Issue 25, session 21, call 9: the read-through refactor (PassPlan::PrefillLaunches, ChoosePrefillSplits): tests.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
date -u | tee $L/device.txt
SECONDS=0
for t in cuda_backend_test cuda_prefill_test; do
  timeout 100 $t > $L/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]" -A4 $L/$t.log | head -10
done
grep -E "persistent from" $L/cuda_backend_test.log | cut -c1-160
xz -9 $L/*.log
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
