#!/usr/bin/env bash
# Call 7: the served cached TTFT at concurrency 1, the idle-consumer worker (757adf2) against main before it
# (7c22ad8, lazykv-worker-old), alternated, two rounds (run_cached_ttft_gpu.sh's trace, 60 requests).
set -u
source pc-bundle/env.sh
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
bin=$(dirname "$(command -v lazykv-worker)")
trace=/tmp/trace_c1.jsonl
lazykv-bench trace --docs 100 --docs-per-request 8 --zipf-s 1.1 --requests 60 --doc-lengths fixed:512 \
  --question-tokens 16 --max-tokens 16 --vocab 128000 --concurrency 1 --seed 1 --out "$trace" > /dev/null
for r in 1 2; do for w in lazykv-worker lazykv-worker-old; do
  (cd /tmp && timeout 150 lazykv-bench compare --worker "$bin/$w" --trace "$trace" --modes lazy \
    --model synthetic:llama3-8b --worker-arg --kv-pool --worker-arg 20GiB --worker-arg --no-cache-tier \
    --out-dir "$L/served_${w}_$r" > "$L/served_${w}_$r.txt" 2>&1); echo "served $w r=$r rc=$? ${SECONDS}s"
  grep -E -A1 "TTFT p50 by" "$L/served_${w}_$r.txt" | tail -1
  find "$L/served_${w}_$r" -name "*.jsonl" -size +256k -delete
done; done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
