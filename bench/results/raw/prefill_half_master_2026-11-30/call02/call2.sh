#!/usr/bin/env bash
# Issue 25, session 28, call 2: the fp16 master (new) against main and against the same code with the fp32 tile's shared memory kept (pad: isolates the smaller smem / L1 carveout), alternated twice.
set -u
source pc-bundle/env.sh
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
row() {  # $1: log
  echo "$(grep -E '^full ' $1 | awk '{print "default", $8, "norot", $9, "rot", $10}') | one-tile $(grep -E 'schedule 2:' $1 | sed -E 's/.*lazy [0-9.]+ ms, ([0-9.]+) TFLOP.*no rotation [0-9.]+ ms, ([0-9.]+) TFLOP.*rotation ([0-9.%]+).*/\1 norot \2 rot \3/' | head -1) | backend bf16 $(grep -E "backend's launch, output in bf16" $1 | sed -E 's/.*bf16: [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/' | head -1)"
}
for r in 1 2; do
  for len in 16384 8192; do
    for v in main new pad; do
      f=$L/${v}_b${len}_$r.txt
      b=cuda_prefill_bench; [[ $v != new ]] && b=${v}_cuda_prefill_bench
      timeout 90 $b $len full > $f 2>&1
      echo "r$r $len $v rc=$?: $(row $f)"
    done
  done
done
echo "done ${SECONDS}s"
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
