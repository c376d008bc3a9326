#!/usr/bin/env bash
# Issue 25, session 21, call 6 (after review): the jump shape moved inside one delta run (own keys scaled from
# their block 4: the second half of the own run's first tile); mut_: O left unscaled in the second half's
# rescale (must fail own_keys_jump_mid_tile); PinRegisters after the wait; the mixed table's one launch as the
# backend runs it; backend tests.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for t in cuda_prefill_test cuda_backend_test; do
  timeout 150 $t > $L/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]" -A4 $L/$t.log | head -16
done
grep -E "own_keys_(jump_mid_tile|dominate) seq" $L/cuda_prefill_test.log | awk '{print $2, $NF}' | sort -k2 -g | tail -2
timeout 100 mut_cuda_prefill_test --gtest_filter='*own_keys*' > $L/mut.log 2>&1; echo "mutant rc=$? ${SECONDS}s"
grep -E "^\[       OK|^\[  FAILED  \] Shapes" $L/mut.log | cut -c1-100 | sort -u
grep -E "own_keys_(jump_mid_tile|dominate) seq" $L/mut.log | awk '{print $2, $NF}' | sort -k2 -g | tail -3
for a in "16384 full" "1024 full" mixed; do
  timeout 90 cuda_prefill_bench $a > $L/bench_${a// /_}.txt 2>&1; echo "bench $a rc=$? ${SECONDS}s"
  grep -E "^full |backend's launch, output|persistent kernel, q rotated" $L/bench_${a// /_}.txt | cut -c1-170
done
sed -n '/^mixed/,$p' $L/bench_mixed.txt
xz -9 $L/*.log
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
