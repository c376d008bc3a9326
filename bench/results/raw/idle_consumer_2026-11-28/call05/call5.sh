#!/usr/bin/env bash
# Call 5: a half-full tile's consumers take alternate KV tiles and merge: tests, memcheck, questions and TTFT
# against the idle-consumer build (_a, d689c05) and main before it (_old, 7c22ad8), alternated.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
timeout 200 cuda_prefill_test > $L/prefill_test.log 2>&1; echo "prefill_test rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/prefill_test.log | tr '\n' ' ')"
grep -E "Failure|FAILED  \]|question.*rel error" $L/prefill_test.log | head -12
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 cuda_prefill_test --gtest_filter='*question*' > $L/memcheck.log 2>&1; echo "memcheck rc=$? ${SECONDS}s"; grep -E "ERROR SUMMARY|PASSED|FAILED" $L/memcheck.log | head -3
timeout 150 cuda_backend_test > $L/backend_test.log 2>&1; echo "backend_test rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/backend_test.log | tr '\n' ' ')"
for r in 1 2; do for b in "" _a _old; do
  timeout 60 cuda_prefill_bench$b questions > $L/questions${b}_$r.txt 2>&1; echo "questions$b r=$r rc=$? ${SECONDS}s"
  grep -E "^ +(1|8|32|64) +4 " $L/questions${b}_$r.txt
done; done
for r in 1 2; do for b in "" _a; do
  timeout 100 cuda_backend_bench$b > $L/backend${b}_$r.txt 2>&1; echo "backend$b r=$r rc=$? ${SECONDS}s"
  grep -E "^TTFT" $L/backend${b}_$r.txt | cut -c1-160
done; done
timeout 150 cuda_prefill_bench > $L/prefill.txt 2>&1; echo "prefill rc=$? ${SECONDS}s"
grep -E "^(full|last) " $L/prefill.txt
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
