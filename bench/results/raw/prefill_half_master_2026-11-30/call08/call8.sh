#!/usr/bin/env bash
# Issue 25, session 28, call 8: is the persistent kernel's +3.5% in call 6 (the same machine code
# as main's) a neighbour effect of the alternated timing? The bench alternates it with the
# one-tile kernel (fn_b, fn_a, fn_b, events between); every prefill kernel lets its successor in
# at its start (programmatic dependent launch). main and the FA3-loop build (fa3: a slower
# one-tile kernel), with LAZYKV_DEPENDENT_LAUNCH=1 and =0, 16k and 8k, alternated twice; SM clock
# and power sampled every 200 ms.
set -u
source pc-bundle/env.sh
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 200 > $L/clocks.csv 2>&1 &
SMI=$!
row() {  # $1: log
  echo "$(sed -n 13p $1 | sed -E 's/.*persistent kernel, q rotated: [0-9.]+ ms, ([0-9.]+) TFLOP.*one-tile kernel: [0-9.]+ ms, ([0-9.]+) TFLOP.*/persistent \1 one-tile \2/') | backend $(grep -E "backend's launch, output in bf16" $1 | sed -E 's/.*bf16: [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/' | head -1)"
}
for r in 1 2; do
  for len in 16384 8192; do
    for pdl in 1 0; do
      for v in main fa3; do
        f=$L/${v}_pdl${pdl}_b${len}_$r.txt
        echo "$(date -u +%T.%N | cut -c1-12) start $f" >> $L/clocks_marks.txt
        LAZYKV_DEPENDENT_LAUNCH=$pdl timeout 90 ${v}_cuda_prefill_bench $len full > $f 2>&1
        echo "r$r $len pdl=$pdl $v rc=$?: $(row $f)"
      done
    done
  done
done
kill $SMI
echo "done ${SECONDS}s"
awk -F', ' 'NR>1 {print $2}' $L/clocks.csv | sort | uniq -c | sort -rn | head -5
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
