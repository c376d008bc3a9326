#!/usr/bin/env bash
# Issue 25, session 20, call 1: work tiles counted from each sequence's own last (new) against the former order
# (ol_), the deferred box stores (dp_), tests; the mixed launch table; the Zipf trace with the bound and without.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for t in cuda_prefill_test cuda_backend_test; do
  timeout 150 $t > $L/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]" $L/$t.log | head -8
done
for r in 1 2; do
  for v in "" ol_ dp_ main_; do
    timeout 40 ${v}cuda_prefill_bench 1024 full > $L/${v}b1k_$r.txt 2>&1; echo "${v:-new} 1k r$r rc=$? ${SECONDS}s"
    grep -E "^full |backend's launch, output" $L/${v}b1k_$r.txt | cut -c1-150
  done
  for v in "" ol_; do
    timeout 60 ${v}cuda_prefill_bench mixed > $L/${v}mixed_$r.txt 2>&1; echo "${v:-new} mixed r$r rc=$? ${SECONDS}s"
    sed -n '/^mixed/,$p' $L/${v}mixed_$r.txt
  done
done
for r in 1 2; do
  for v in main new any; do
    b=cuda_backend_bench; env=""
    [[ $v == main ]] && b=main_cuda_backend_bench
    [[ $v == any ]] && env="LAZYKV_PREFILL_PERSISTENT_MAX_KEYS=1000000"
    env $env timeout 60 $b --e2e-batched --modes block,lazy --max-concurrency 64 > $L/e2e_${v}_$r.txt 2>&1; echo "e2e $v r$r rc=$? ${SECONDS}s"
    grep -E "^(block|lazy) +[0-9]" $L/e2e_${v}_$r.txt | head -2
  done
done
timeout 150 dp_cuda_prefill_test > $L/dp_cuda_prefill_test.log 2>&1; echo "dp test rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/dp_cuda_prefill_test.log | tr '\n' ' ')"
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
