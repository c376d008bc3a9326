#!/usr/bin/env bash
# Issue 25, session 27, call 5: contiguity found once a tile by every copy thread, all loads at once (TileDesc and MakeTile as on main); cuda_prefill_bench against main and =0, alternated twice.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
timeout 200 cuda_prefill_test > $L/cuda_prefill_test.log 2>&1
echo "cuda_prefill_test rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/cuda_prefill_test.log | tr '\n' ' ')"
row() {  # $1: log
  echo "$(grep -E '^full ' $1 | awk '{print "default", $8, "norot", $9, "rot", $10}') | one-tile $(grep -E 'schedule 2:' $1 | sed -E 's/.*lazy [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/' | head -1) | backend bf16 $(grep -E "backend's launch, output in bf16" $1 | sed -E 's/.*bf16: [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/' | head -1)"
}
for r in 1 2; do
  for len in 16384 4096 1024; do
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
echo "done ${SECONDS}s"
xz -9 $L/cuda_prefill_test.log
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
