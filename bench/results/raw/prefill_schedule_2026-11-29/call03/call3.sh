#!/usr/bin/env bash
# Issue 25, session 20, call 3: the long-prefill rule asked with the bf16 output wanted (fp32 callers keep the one-tile
# kernel); tests; 2k-16k; the mixed table with the two-launch split; the Zipf trace in process against main.
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
for shape in "2048 full" "4096 full" "16384 full" "4096 last" "1024 full"; do
  f=$L/bench_${shape// /_}.txt
  timeout 60 cuda_prefill_bench $shape > $f 2>&1; echo "$shape rc=$? ${SECONDS}s"
  grep -E "^(full|last) |backend's launch, output|persistent kernel, q rotated" $f | cut -c1-220
done
for r in 1 2; do
  timeout 90 cuda_prefill_bench mixed > $L/mixed_$r.txt 2>&1; echo "mixed r$r rc=$? ${SECONDS}s"
  sed -n '/^mixed/,$p' $L/mixed_$r.txt
done
for r in 1 2; do
  for v in main new; do
    b=cuda_backend_bench; [[ $v == main ]] && b=main_cuda_backend_bench
    timeout 60 $b --e2e-batched --modes block,lazy --max-concurrency 64 > $L/e2e_${v}_$r.txt 2>&1; echo "e2e $v r$r rc=$? ${SECONDS}s"
    grep -E "^(block|lazy) +[0-9]" $L/e2e_${v}_$r.txt | head -2
  done
done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
