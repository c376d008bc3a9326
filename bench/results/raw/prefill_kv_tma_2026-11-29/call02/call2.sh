#!/usr/bin/env bash
# Issue 25, session 27, call 2: KV tiles at consecutive pool slots by TMA in both prefill kernels
# (default on; LAZYKV_PREFILL_KV_TMA=0 turns it off) and the block allocator's runs: tests with and
# without; cuda_prefill_bench against main (eaeb630) and =0, alternated; the whole table with SDPA;
# the cached TTFT (cuda_backend_bench) with and without.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for tma in 1 0; do
  LAZYKV_PREFILL_KV_TMA=$tma timeout 200 cuda_prefill_test > $L/cuda_prefill_test_tma$tma.log 2>&1
  echo "cuda_prefill_test tma=$tma rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/cuda_prefill_test_tma$tma.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]" $L/cuda_prefill_test_tma$tma.log | head -8
done
timeout 200 cuda_backend_test > $L/cuda_backend_test.log 2>&1
echo "cuda_backend_test rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/cuda_backend_test.log | tr '\n' ' ')"
grep -E "Failure|FAILED  \]" $L/cuda_backend_test.log | head -8
row() {  # $1: log
  echo "$(grep -E '^full ' $1 | awk '{print "default", $8, "norot", $9, "rot", $10}') | one-tile $(grep -E 'schedule 2:' $1 | sed -E 's/.*lazy [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/' | head -1) | backend bf16 $(grep -E "backend's launch, output in bf16" $1 | sed -E 's/.*bf16: [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/' | head -1)"
}
for r in 1 2; do
  for len in 4096 16384 1024; do
    for v in main tma0 new; do
      f=$L/${v}_b${len}_$r.txt
      case $v in
        main) timeout 60 main_cuda_prefill_bench $len full > $f 2>&1 ;;
        tma0) LAZYKV_PREFILL_KV_TMA=0 timeout 60 cuda_prefill_bench $len full > $f 2>&1 ;;
        new) timeout 60 cuda_prefill_bench $len full > $f 2>&1 ;;
      esac
      echo "r$r $len $v rc=$?: $(row $f)"
    done
  done
done
timeout 150 cuda_prefill_bench > $L/bench_all.txt 2>&1; echo "whole table rc=$? ${SECONDS}s"
grep -E "^(full|last) |backend's launch, output|persistent kernel, q rotated" $L/bench_all.txt | cut -c1-200
timeout 150 python3 pc-bundle/data/sdpa_prefill_reference.py --prefill-log $L/bench_all.txt > $L/sdpa.txt 2>&1
echo "SDPA rc=$? ${SECONDS}s"; sed -n '/prefill ratios/,$p' $L/sdpa.txt | head -14
for r in 1 2; do
  for tma in 0 1; do
    LAZYKV_PREFILL_KV_TMA=$tma timeout 120 cuda_backend_bench > $L/backend_tma${tma}_$r.txt 2>&1
    echo "backend tma=$tma r$r rc=$? ${SECONDS}s: $(grep -E '^TTFT' $L/backend_tma${tma}_$r.txt | head -2 | tr '\n' ' ')"
  done
done
echo "done ${SECONDS}s"
for f in $L/cuda_prefill_test_tma*.log $L/cuda_backend_test.log; do xz -9 $f; done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
