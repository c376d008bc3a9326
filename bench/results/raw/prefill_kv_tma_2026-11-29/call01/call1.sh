#!/usr/bin/env bash
# Issue 25, session 27, call 1: KV tiles at consecutive pool slots by TMA boxes of 128 slots in the
# one-tile prefill kernel (LAZYKV_PREFILL_KV_TMA=1) against the same build without (=0) and main
# (eaeb630): tests with and without; cuda_prefill_bench alternated at 1k / 4k / 16k.
set -u
source pc-bundle/env.sh
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for tma in 1 0; do
  LAZYKV_PREFILL_KV_TMA=$tma timeout 150 cuda_prefill_test > $L/cuda_prefill_test_tma$tma.log 2>&1
  echo "cuda_prefill_test tma=$tma rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/cuda_prefill_test_tma$tma.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]" $L/cuda_prefill_test_tma$tma.log | head -8
done
row() {  # $1: log
  echo "$(grep -E '^full ' $1 | awk '{print "default", $8, "norot", $9, "rot", $10}') | one-tile $(grep -E 'schedule 2:' $1 | sed -E 's/.*lazy [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/' | head -1) | backend bf16 $(grep -E "backend's launch, output in bf16" $1 | sed -E 's/.*bf16: [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/' | head -1)"
}
for r in 1 2; do
  for len in 4096 16384 1024; do
    for v in main tma0 tma1; do
      f=$L/${v}_b${len}_$r.txt
      case $v in
        main) timeout 60 main_cuda_prefill_bench $len full > $f 2>&1 ;;
        tma0) LAZYKV_PREFILL_KV_TMA=0 timeout 60 cuda_prefill_bench $len full > $f 2>&1 ;;
        tma1) LAZYKV_PREFILL_KV_TMA=1 timeout 60 cuda_prefill_bench $len full > $f 2>&1 ;;
      esac
      echo "r$r $len $v rc=$?: $(row $f)"
    done
  done
done
echo "done ${SECONDS}s"
for t in 1 0; do xz -9 $L/cuda_prefill_test_tma$t.log; done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
