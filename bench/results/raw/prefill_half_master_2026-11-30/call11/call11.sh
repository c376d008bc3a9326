#!/usr/bin/env bash
# Issue 25, session 28, call 11: the copy warps of the one-tile kernel skip a TMA tile (thread 0
# issues its boxes and arrives for all 256 with a counted arrive; warps 1-3 no longer spin on the
# slot's barrier; the persistent kernel's warps still wait but do not arrive): tests, then
# cuda_prefill_bench against main (005c71c, with the SM clock lines), alternated twice.
set -u
source pc-bundle/env.sh
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
timeout 240 cuda_prefill_test > $L/cuda_prefill_test.log 2>&1
echo "cuda_prefill_test rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/cuda_prefill_test.log | tr '\n' ' ')"
grep -E "Failure|FAILED  \]" $L/cuda_prefill_test.log | head -5
row() {  # $1: log
  echo "$(grep -E '^full ' $1 | awk '{print "default", $8, "norot", $9, "rot", $10}') | one-tile $(grep -E 'schedule 2:' $1 | sed -E 's/.*lazy [0-9.]+ ms, ([0-9.]+) TFLOP.*no rotation [0-9.]+ ms, ([0-9.]+) TFLOP.*rotation ([0-9.%]+).*/\1 norot \2 rot \3/' | head -1) | backend bf16 $(grep -E "backend's launch, output in bf16" $1 | sed -E 's/.*bf16: [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/' | head -1) | clk $(grep -E 'SM clock' $1 | sed -E 's/.*: ([0-9]+) MHz.*/\1/' | tr '\n' '/')"
}
for r in 1 2; do
  for len in 16384 8192 4096; do
    for v in main arrive; do
      f=$L/${v}_b${len}_$r.txt
      timeout 90 ${v}_cuda_prefill_bench $len full > $f 2>&1
      echo "r$r $len $v rc=$?: $(row $f)"
    done
  done
done
echo "done ${SECONDS}s"
xz -9 $L/cuda_prefill_test.log
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
