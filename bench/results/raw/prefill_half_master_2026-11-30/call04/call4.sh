#!/usr/bin/env bash
# Issue 25, session 28, call 4: where the extra barrier stalls of the pad build's kernel without
# rotation are (call 3): ncu per-instruction samples by role (stall_samples.py), the second
# one-tile launch of cuda_prefill_bench 16384 full (no rotation), main / pad.
set -u
source pc-bundle/env.sh
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for v in main pad; do
  out=$L/source_16k_norot_$v
  timeout 150 ncu --clock-control none -k "regex:LazyPrefillSpecializedKernel" -s 1 -c 1 --section SourceCounters \
    --section WarpStateStats --import-source no -f -o $out ${v}_cuda_prefill_bench 16384 full > $out.log 2>&1
  ncu -i $out.ncu-rep --page source --csv --print-source sass > $out.csv 2>&1
  echo "== $v ${SECONDS}s: $(wc -l < $out.csv) lines"
  python3 pc-bundle/data/stall_samples.py $out.csv 6 | cut -c1-170 | head -70 > $out.roles.txt
  cat $out.roles.txt
  xz -9 $out.csv; rm -f $out.ncu-rep
done
echo "done ${SECONDS}s"
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
