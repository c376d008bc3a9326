#!/usr/bin/env bash
# Issue 25, session 22, call 7: the Zipf trace served (lazykv-bench compare, the default tier, concurrency
# 64), the new worker against main's (d3a2c0a), alternated, two rounds.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
bin=$(dirname "$(command -v lazykv-worker)")
trace=/tmp/trace_c64.jsonl
lazykv-bench trace --docs 100 --docs-per-request 8 --zipf-s 1.1 --requests 160 --doc-lengths fixed:512 \
  --question-tokens 16 --max-tokens 64 --vocab 128000 --concurrency 64 --seed 1 --out "$trace" > /dev/null
for r in 1 2; do
  for v in main new; do
    w=lazykv-worker; [[ $v == main ]] && w=main_lazykv-worker
    d=/tmp/served_${v}_$r
    timeout 150 lazykv-bench compare --worker "$bin/$w" --trace "$trace" --modes lazy,block \
      --model synthetic:llama3-8b --worker-arg --kv-pool --worker-arg 50GiB --out-dir $d > $L/served_${v}_$r.txt 2>&1
    echo "served $v r$r rc=$? ${SECONDS}s"; grep -E -A2 "^mode" $L/served_${v}_$r.txt
    gzip -c $d/compare.json > $L/served_${v}_$r.json.gz 2>/dev/null; rm -rf $d
  done
done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
