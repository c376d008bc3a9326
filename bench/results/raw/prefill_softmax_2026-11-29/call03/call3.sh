#!/usr/bin/env bash
# Rotation warps backing off while a delta ahead: bo_ (256 ns cap), bk_ (1024), sw_ (spinning), main_.
set -uo pipefail
bundle=$(cd pc-bundle && pwd)
source "$bundle/env.sh"
export LAZYKV_MODELS_DIR=$BUNDLE_DATA
logs=$OUT/logs; mkdir -p $logs
start=$(date +%s); el() { echo "$(($(date +%s) - start)) s"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
for v in bo_; do
  timeout 100 ${v}cuda_prefill_test > $logs/${v}prefill_test.log 2>&1
  echo "${v}cuda_prefill_test rc=$? ($(el)): $(grep -E '^\[  (PASSED|FAILED)' $logs/${v}prefill_test.log | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]" $logs/${v}prefill_test.log | head -5
  grep -E "own_keys_jump_mid_tile seq" $logs/${v}prefill_test.log | awk '{print $NF}' | sort -g | tail -1 | sed 's/^/  worst jump_mid_tile rel error: /'
done
for round in 1 2; do
  for len in 1024 4096 16384; do
    for v in main_ sw_ bo_ bk_; do
      timeout 60 ${v}cuda_prefill_bench $len full > $logs/${v}bench_${len}_$round.log 2>&1
      l=$(grep -E "^full " $logs/${v}bench_${len}_$round.log | awk '{print $8, $9, $10}')
      s2=$(grep -E "schedule 2:" $logs/${v}bench_${len}_$round.log | sed -E 's/.*lazy [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/')
      bk=$(grep -E "backend's launch, output in bf16" $logs/${v}bench_${len}_$round.log | sed -E 's/.*bf16: [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/')
      echo "r$round $len $v: default lazy/norot/rot $l | one-tile $s2 | backend bf16 $bk"
    done
  done
done
echo "done ($(el))"
xz -9 $logs/*prefill_test.log
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $logs
