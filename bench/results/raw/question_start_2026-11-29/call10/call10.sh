#!/usr/bin/env bash
# Issue 25, session 22, call 10: the mixed table (one launch of documents and questions), main's build
# (its one-tile launch walks each CTA's table) against the new one (every launch on work starts it
# makes), alternated, two rounds.
set -uo pipefail
bundle=$(cd pc-bundle && pwd)
source "$bundle/env.sh"
logs=$OUT/logs; mkdir -p $logs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
for r in 1 2; do
  for v in main_ ""; do
    timeout 100 ${v}cuda_prefill_bench mixed > $logs/${v}mixed_$r.txt 2>&1
    echo "r$r ${v:-new_} rc=$?"; sed -n '/^mixed/,$p' $logs/${v}mixed_$r.txt | sed -n '3,6p'
  done
done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $logs
