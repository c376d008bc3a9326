#!/usr/bin/env bash
# Issue 25, session 28, call 5: is the ~3% of call 1-4 the code's placement? Never-run code put
# before the consumers' loop (LAYOUT PROBE): mainpad = main with its loops moved to about the
# fp16 build's addresses (consumer loop 0xc470 against 0xc460); newpad = the fp16 build (one-pass
# MakeFirstQuery) with its loop at main's address modulo 4 KB (0xd9c0 against 0xa950).
# cuda_prefill_bench 16384 full twice, 8192 once, alternated.
set -u
source pc-bundle/env.sh
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
row() {  # $1: log
  echo "$(grep -E '^full ' $1 | awk '{print "default", $8, "norot", $9, "rot", $10}') | one-tile $(grep -E 'schedule 2:' $1 | sed -E 's/.*lazy [0-9.]+ ms, ([0-9.]+) TFLOP.*no rotation [0-9.]+ ms, ([0-9.]+) TFLOP.*rotation ([0-9.%]+).*/\1 norot \2 rot \3/' | head -1)"
}
for r in 1 2 3; do
  len=16384; [[ $r == 3 ]] && len=8192
  for v in main new mainpad newpad; do
    f=$L/${v}_b${len}_$r.txt
    b=cuda_prefill_bench; [[ $v != new ]] && b=${v}_cuda_prefill_bench
    timeout 90 $b $len full > $f 2>&1
    echo "r$r $len $v rc=$?: $(row $f)"
  done
done
echo "done ${SECONDS}s"
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
