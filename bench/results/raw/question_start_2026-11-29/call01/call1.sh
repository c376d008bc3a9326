#!/usr/bin/env bash
# Issue 25, session 22, call 1: the softmax's row sums on the tensor cores (P times a ones operand,
# an m64n8 wgmma beside each P V step) and the kept check as packed maxima of the bf16 P (new),
# against main (d3a2c0a). Tests (mut_: the second half's check never fails, which
# own_keys_jump_mid_tile must catch), then cuda_prefill_bench alternated.
set -uo pipefail
bundle=$(cd pc-bundle && pwd)
source "$bundle/env.sh"
export LAZYKV_MODELS_DIR=$BUNDLE_DATA
logs=$OUT/logs; mkdir -p $logs
start=$(date +%s); el() { echo "$(($(date +%s) - start)) s"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; date -u
for v in "" mut_; do
  timeout 100 ${v}cuda_prefill_test > $logs/${v}prefill_test.log 2>&1
  echo "${v}cuda_prefill_test rc=$? ($(el)): $(grep -E '^\[  (PASSED|FAILED)' $logs/${v}prefill_test.log | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]" $logs/${v}prefill_test.log | head -5
  grep -E "own_keys_jump_mid_tile seq" $logs/${v}prefill_test.log | awk '{print $NF}' | sort -g | tail -1 | sed 's/^/  worst jump_mid_tile rel error: /'
done
timeout 150 cuda_backend_test > $logs/backend_test.log 2>&1
echo "cuda_backend_test rc=$? ($(el)): $(grep -E '^\[  (PASSED|FAILED)' $logs/backend_test.log | tr '\n' ' ')"
for round in 1 2; do
  for len in 1024 4096 8192 16384; do
    for v in main_ ""; do
      f=$logs/${v}bench_${len}_$round.log
      timeout 60 ${v}cuda_prefill_bench $len full > $f 2>&1
      l=$(grep -E "^full " $f | awk '{print $8, $9, $10}')
      s2=$(grep -E "schedule 2:" $f | sed -E 's/.*lazy [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/')
      bk=$(grep -E "backend's launch, output in bf16" $f | sed -E 's/.*bf16: [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/')
      echo "r$round $len ${v:-new_}: default lazy/norot/rot $l | one-tile $s2 | backend bf16 $bk"
    done
  done
done
echo "done ($(el))"
xz -9 $logs/*prefill_test.log
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $logs
