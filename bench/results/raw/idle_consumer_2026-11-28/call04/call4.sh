#!/usr/bin/env bash
# Call 4: the specialized prefill kernel's consumer with no rows idles (a question's half-full packed tile):
# tests, memcheck on the question shapes, questions and full-prefill tables and the TTFT, new against old alternated.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
timeout 200 cuda_prefill_test > $L/prefill_test.log 2>&1; echo "prefill_test rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/prefill_test.log | tr '\n' ' ')"
grep -E "Failure|FAILED  \]" $L/prefill_test.log | head -8
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 cuda_prefill_test --gtest_filter='*question*' > $L/memcheck.log 2>&1; echo "memcheck rc=$? ${SECONDS}s"; grep -E "ERROR SUMMARY|PASSED|FAILED" $L/memcheck.log | head -3
timeout 150 cuda_backend_test > $L/backend_test.log 2>&1; echo "backend_test rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/backend_test.log | tr '\n' ' ')"
for r in 1 2; do for b in "" _old; do
  timeout 60 cuda_prefill_bench$b questions > $L/questions${b}_$r.txt 2>&1; echo "questions$b r=$r rc=$? ${SECONDS}s"
  grep -E "^ +(1|8|32|64) +4 " $L/questions${b}_$r.txt
done; done
for r in 1 2; do for b in "" _old; do
  timeout 100 cuda_backend_bench$b > $L/backend${b}_$r.txt 2>&1; echo "backend$b r=$r rc=$? ${SECONDS}s"
  grep -E "^TTFT" $L/backend${b}_$r.txt | cut -c1-160
done; done
for b in "" _old; do
  [[ $SECONDS -gt 420 ]] && break
  timeout 150 cuda_prefill_bench$b > $L/prefill${b}.txt 2>&1; echo "prefill$b rc=$? ${SECONDS}s"
  grep -E "^(full|last) " $L/prefill${b}.txt
done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
