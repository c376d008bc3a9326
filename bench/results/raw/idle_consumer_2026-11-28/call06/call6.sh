#!/usr/bin/env bash
# Call 6: the Zipf trace under load in process (block and lazy, concurrency 64), the idle-consumer build (_a, d689c05)
# against main before it (_old, 7c22ad8), alternated, two rounds.
set -u
source pc-bundle/env.sh
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for r in 1 2; do for b in _a _old; do
  timeout 150 cuda_backend_bench$b --e2e-batched --modes block,lazy --max-concurrency 64 > $L/e2e${b}_$r.txt 2>&1; echo "e2e$b r=$r rc=$? ${SECONDS}s"
  grep -E "^(block|lazy) +[0-9]|^lazy over block" $L/e2e${b}_$r.txt | head -3
done; done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
