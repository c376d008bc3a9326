#!/usr/bin/env bash
# Issue 25, session 27, call 6: the kept code (TMA copies of KV tiles at consecutive pool slots,
# found once a tile): tests; the whole prefill table with SDPA in the same run; where the one-tile
# kernel's warps wait at 16k with and without the TMA copies (ncu per-instruction samples by role).
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for t in cuda_prefill_test cuda_backend_test; do
  timeout 200 $t > $L/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]" $L/$t.log | head -8
done
LAZYKV_PREFILL_KV_TMA=0 timeout 200 cuda_prefill_test > $L/cuda_prefill_test_tma0.log 2>&1
echo "cuda_prefill_test tma=0 rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/cuda_prefill_test_tma0.log | tr '\n' ' ')"
timeout 150 cuda_prefill_bench > $L/bench_all.txt 2>&1; echo "whole table rc=$? ${SECONDS}s"
grep -E "^(full|last) |backend's launch, output" $L/bench_all.txt | cut -c1-200
timeout 150 python3 pc-bundle/data/sdpa_prefill_reference.py --prefill-log $L/bench_all.txt > $L/sdpa.txt 2>&1
echo "SDPA rc=$? ${SECONDS}s"; sed -n '/prefill ratios/,$p' $L/sdpa.txt | head -14
for tma in 1 0; do
  out=$L/source_16k_tma$tma
  LAZYKV_PREFILL_KV_TMA=$tma timeout 150 ncu --clock-control none -k "regex:LazyPrefillSpecializedKernel" -c 1 --section SourceCounters \
    --section WarpStateStats --import-source no -f -o $out cuda_prefill_bench 16384 full > $out.log 2>&1
  ncu -i $out.ncu-rep --page source --csv --print-source sass > $out.csv 2>&1
  echo "== stalls tma=$tma ${SECONDS}s: $(wc -l < $out.csv) lines"
  python3 pc-bundle/data/stall_samples.py $out.csv 4 | cut -c1-160 | head -60 > $out.roles.txt
  head -40 $out.roles.txt
  rm -f $out.csv
done
echo "done ${SECONDS}s"
for f in $L/cuda_prefill_test.log $L/cuda_prefill_test_tma0.log $L/cuda_backend_test.log; do xz -9 $f; done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
