#!/usr/bin/env bash
# Issue 25, session 19, call 10: the final build (the persistent choice's key bound kept): tests; the prefill table's
# bf16 lines at 1k-4k; the Zipf trace under load with LAZYKV_PREFILL_OUT_BF16=1 and =0 in turn.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for t in cuda_prefill_test cuda_backend_test; do
  timeout 200 $t > $L/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]|bf16 outputs differ" $L/$t.log | head -8
done
for shape in "1024 full" "1024 last" "2048 full" "4096 full"; do
  f=$L/bench_${shape// /_}.txt
  timeout 90 cuda_prefill_bench $shape > $f 2>&1; echo "$shape rc=$? ${SECONDS}s"
  grep -E "^(full|last) |schedule 3 with work starts, q|backend's launch, output|persistent kernel, q rotated" $f | cut -c1-190
done
for r in 1 2 3; do for v in 1 0; do
  LAZYKV_PREFILL_OUT_BF16=$v timeout 150 cuda_backend_bench --e2e-batched --modes block,lazy --max-concurrency 64 > $L/e2e_bf16${v}_$r.txt 2>&1; echo "e2e out_bf16=$v r=$r rc=$? ${SECONDS}s"
  grep -E "^(block|lazy) +[0-9]" $L/e2e_bf16${v}_$r.txt | head -2
  [[ $SECONDS -gt 330 ]] && break 2
done; done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
