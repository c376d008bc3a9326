#!/usr/bin/env bash
# Issue 25, session 28, call 9: main's prefill table with the SM clock of each row (sm_clock.h,
# checked by cuda_sm_clock_test and against nvidia-smi's samples), and SDPA in the same run.
set -u
source pc-bundle/env.sh
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
timeout 60 cuda_sm_clock_test > $L/cuda_sm_clock_test.log 2>&1
echo "cuda_sm_clock_test rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED|SKIPPED \]' $L/cuda_sm_clock_test.log | sort -u | tr '\n' ' ')"
grep -E "Failure|Expected|clock" $L/cuda_sm_clock_test.log | head -6
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv -lms 200 > $L/clocks.csv 2>&1 &
SMI=$!
timeout 200 cuda_prefill_bench > $L/bench_all.txt 2>&1; echo "whole table rc=$? ${SECONDS}s"
kill $SMI
grep -E "^(full|last) |backend's launch, output|SM clock" $L/bench_all.txt | cut -c1-170
timeout 150 python3 pc-bundle/data/sdpa_prefill_reference.py --prefill-log $L/bench_all.txt > $L/sdpa.txt 2>&1
echo "SDPA rc=$? ${SECONDS}s"; sed -n '/prefill ratios/,$p' $L/sdpa.txt | head -14
awk -F', ' 'NR>1 {print $2}' $L/clocks.csv | sort | uniq -c | sort -rn | head -6
echo "done ${SECONDS}s"
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
