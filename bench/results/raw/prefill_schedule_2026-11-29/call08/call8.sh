#!/usr/bin/env bash
# Issue 25, session 20, call 8: the long-prefill rule at a quarter of the keys: tests, the "last 512" rows, the trace.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
timeout 150 cuda_prefill_test > $L/cuda_prefill_test.log 2>&1; echo "cuda_prefill_test rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/cuda_prefill_test.log | tr '\n' ' ')"
grep -E "Failure|FAILED  \]" $L/cuda_prefill_test.log | head -8
for shape in "2048 last" "4096 last" "2048 full" "16384 last"; do
  f=$L/bench_${shape// /_}.txt
  timeout 60 cuda_prefill_bench $shape > $f 2>&1; echo "$shape rc=$? ${SECONDS}s"
  grep -E "^(full|last) |backend's launch, output|persistent kernel, q rotated" $f | cut -c1-220
done
for r in 1 2; do for v in main new; do
  b=cuda_backend_bench; [[ $v == main ]] && b=main_cuda_backend_bench
  timeout 60 $b --e2e-batched --modes block,lazy --max-concurrency 64 > $L/e2e_${v}_$r.txt 2>&1; echo "e2e $v r$r rc=$? ${SECONDS}s"
  grep -E "^(block|lazy) +[0-9]" $L/e2e_${v}_$r.txt | head -2
done; done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
