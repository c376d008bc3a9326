#!/usr/bin/env bash
# Issue 25, session 28, call 3: why the fp16 master's build runs the kernel without rotation
# ~3% slower although its loops are the same machine code as main's (pad: that build with
# main's shared-memory layout): ncu stall reasons per issued instruction, the first four
# one-tile launches of cuda_prefill_bench 16384 full (lazy and no-rotation alternate), main / pad.
set -u
source pc-bundle/env.sh
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
M=gpu__time_duration.sum,smsp__inst_executed.sum,smsp__cycles_active.avg
for r in no_instruction barrier long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle dispatch_stall branch_resolving selected not_selected sleeping membar misc tex_throttle drain imc_miss; do
  M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
done
for v in main pad; do
  b=${v}_cuda_prefill_bench
  timeout 200 ncu --clock-control none -k "regex:LazyPrefillSpecializedKernel" -c 4 --metrics $M --csv --page raw $b 16384 full > $L/ncu_$v.csv 2> $L/ncu_$v.err
  echo "== $v rc=$? ${SECONDS}s"
  /usr/bin/env python3 - $L/ncu_$v.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
start = next(i for i, r in enumerate(rows) if 'ID' in r)
head, units, data = rows[start], rows[start + 1], rows[start + 2:]
for i, name in enumerate(head):
    if name.startswith(('gpu__', 'smsp__')):
        print(f"{name.replace('smsp__average_warps_issue_stalled_', '').replace('_per_issue_active.ratio', ''):40s}", ' '.join(f"{r[i]:>14s}" for r in data))
PY
done
echo "done ${SECONDS}s"
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
