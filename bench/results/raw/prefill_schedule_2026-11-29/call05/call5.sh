#!/usr/bin/env bash
# Issue 25, session 20, call 5: how many steps of the Zipf trace (in process and served) ran two prefill launches.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
timeout 60 cuda_backend_bench --e2e-batched --modes block,lazy --max-concurrency 64 > $L/e2e_on.txt 2>&1; echo "e2e rc=$? ${SECONDS}s"
grep -E "^(block|lazy) +[0-9]|backend:" $L/e2e_on.txt | cut -c1-250
bin=$(dirname "$(command -v lazykv-worker)")
trace=/tmp/trace_c64.jsonl
lazykv-bench trace --docs 100 --docs-per-request 8 --zipf-s 1.1 --requests 160 --doc-lengths fixed:512 \
  --question-tokens 16 --max-tokens 64 --vocab 128000 --concurrency 64 --seed 1 --out "$trace" > /dev/null
d=/tmp/served_on
timeout 150 lazykv-bench compare --worker "$bin/lazykv-worker" --trace "$trace" --modes lazy,block \
  --model synthetic:llama3-8b --worker-arg --kv-pool --worker-arg 50GiB --out-dir $d > $L/served_on.txt 2>&1
echo "served rc=$? ${SECONDS}s"; grep -E -A2 "^mode" $L/served_on.txt
grep -h "backend:" $d/worker-*.log | sed 's/.*backend: //' | cut -c1-250
cp $d/worker-*.log $L/ 2>/dev/null; rm -rf $d
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
