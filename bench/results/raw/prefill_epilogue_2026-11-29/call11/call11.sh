#!/usr/bin/env bash
# Issue 25, session 19, call 11: after review (the query buffer's release deferred only where the output is staged;
# the backend asks for bf16 only where the persistent kernel writes it; guard bands in the test): tests, 1k, timeline,
# one Zipf pair.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for t in cuda_prefill_test cuda_backend_test; do
  timeout 100 $t > $L/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]|bf16 outputs" $L/$t.log | head -8
done
for shape in "1024 full" "1024 last"; do
  f=$L/bench_${shape// /_}.txt
  timeout 30 cuda_prefill_bench $shape > $f 2>&1; echo "$shape rc=$? ${SECONDS}s"
  grep -E "^(full|last) |schedule 3 with work starts, q|backend's launch, output" $f | cut -c1-170
done
LAZYKV_PREFILL_TIMELINE_Q_ROTATED=1 LAZYKV_PREFILL_TIMELINE_SCHEDULE=3 LAZYKV_PREFILL_TIMELINE_OUT_BF16=1 LAZYKV_PREFILL_TIMELINE_OUT=$L/bf16 timeout 30 tl_cuda_prefill_bench 1024 full > $L/tl_run.txt 2>&1; echo "tl rc=$? ${SECONDS}s"
for v in 1 0; do
  LAZYKV_PREFILL_OUT_BF16=$v timeout 40 cuda_backend_bench --e2e-batched --modes block,lazy --max-concurrency 64 > $L/e2e_bf16${v}.txt 2>&1; echo "e2e out_bf16=$v rc=$? ${SECONDS}s"
  grep -E "^(block|lazy) +[0-9]" $L/e2e_bf16${v}.txt | head -2
done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
