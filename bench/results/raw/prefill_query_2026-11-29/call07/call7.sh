#!/usr/bin/env bash
# Call 7: the final build: tests; the prefill table (every size, default launch and the backend's persistent launch)
# against HEAD's build; the cached TTFT; the Zipf trace under load with the KV write's q rotation on (as chosen) and off.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for t in cuda_prefill_test cuda_backend_test; do
  timeout 200 $t > $L/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]" $L/$t.log | head -8
done
for b in "" head_; do
  timeout 150 ${b}cuda_prefill_bench > $L/${b}prefill.txt 2>&1; echo "${b}prefill rc=$? ${SECONDS}s"
  grep -E "^(full|last) |schedule 3 with work starts" $L/${b}prefill.txt | cut -c1-150
done
for r in 1 2; do
  timeout 100 cuda_backend_bench > $L/backend_$r.txt 2>&1; echo "backend r=$r rc=$? ${SECONDS}s"
  grep -E "^TTFT|^decode step" $L/backend_$r.txt | cut -c1-160
done
for r in 1 2; do for v in 1 0; do
  LAZYKV_ROTATE_Q_IN_KV_WRITE=$v timeout 150 cuda_backend_bench --e2e-batched --modes block,lazy --max-concurrency 64 > $L/e2e_rot${v}_$r.txt 2>&1; echo "e2e rot=$v r=$r rc=$? ${SECONDS}s"
  grep -E "^(block|lazy) +[0-9]" $L/e2e_rot${v}_$r.txt | head -2
done; done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
