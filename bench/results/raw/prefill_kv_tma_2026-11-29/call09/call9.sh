#!/usr/bin/env bash
# Issue 25, session 27, call 9 (probe builds, wrong outputs, valid data): both query buffers made
# from the first query at the CTA's start, so the consumers always read a valid query; rq2 the
# rotation warps load and rotate but store nothing, rq3 they write no query at all; against the
# kept build, 16k and 4k causal full, alternated.
set -u
source pc-bundle/env.sh
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
row() { echo "$(grep -E '^full ' $1 | awk '{print "default", $8, "norot", $9, "rot", $10}') | one-tile $(grep -E 'schedule 2:' $1 | sed -E 's/.*lazy [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/' | head -1)"; }
for r in 1 2; do
  for len in 16384 4096; do
    for v in base rq2 rq3; do
      b=cuda_prefill_bench; [[ $v != base ]] && b=${v}_cuda_prefill_bench
      f=$L/${v}_b${len}_$r.txt
      timeout 60 $b $len full > $f 2>&1
      echo "r$r $len $v rc=$?: $(row $f)"
    done
  done
done
echo "done ${SECONDS}s"
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
