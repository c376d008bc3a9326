#!/usr/bin/env bash
# Issue 25, session 22, call 2: where call 1's tensor-core row sums lost. Probes alternated with main
# (d3a2c0a) and the row sums build (sums_): nosum_ (no sums at all: l stays 0, outputs wrong; the
# instructions' saving alone), ones_ (main's FADD sums and check, plus the m64n8 ones products: their cost alone).
set -uo pipefail
bundle=$(cd pc-bundle && pwd)
source "$bundle/env.sh"
logs=$OUT/logs; mkdir -p $logs
start=$(date +%s); el() { echo "$(($(date +%s) - start)) s"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; date -u
for round in 1 2; do
  for len in 4096 16384; do
    for v in main_ sums_ nosum_ ones_; do
      f=$logs/${v}bench_${len}_$round.log
      timeout 60 ${v}cuda_prefill_bench $len full > $f 2>&1
      l=$(grep -E "^full " $f | awk '{print $8, $9, $10}')
      s2=$(grep -E "schedule 2:" $f | sed -E 's/.*lazy [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/')
      bk=$(grep -E "backend's launch, output in bf16" $f | sed -E 's/.*bf16: [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/')
      echo "r$round $len ${v}: default lazy/norot/rot $l | one-tile $s2 | backend bf16 $bk"
    done
  done
done
echo "done ($(el))"
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $logs
