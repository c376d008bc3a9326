#!/usr/bin/env bash
# On the GPU machine: chunk-shared decode attention's gain through the served API (issue 25).
# The data-path issue's Zipf RAG trace at concurrency 64 (160 requests, 8 documents of 512
# tokens, 64 tokens out) through lazykv-worker in lazy mode, `--shared-decode auto` (the
# default), `exact` (auto with LAZYKV_SHARED_DECODE_EXACT=1: the shared kernel's query and
# probabilities as bf16 hi + lo pairs) and `off`, alternated ROUNDS times (default 2), a fresh
# worker each; each run's summary line and the worker's profile line (how many steps shared how
# much).
# Here: bench/bundle_backend_gpu.sh OUT build lazykv-worker lazykv-bench && cp
#   bench/run_served_shared_decode_gpu.sh OUT/data/
# There: bash OUT/data/run_served_shared_decode_gpu.sh OUT LOGDIR
set -uo pipefail
bundle=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
source "$bundle/env.sh"
bin=$(dirname "$(command -v lazykv-worker)")
cd /tmp
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
trace=/tmp/trace_c64.jsonl
lazykv-bench trace --docs 100 --docs-per-request 8 --zipf-s 1.1 --requests 160 --doc-lengths fixed:512 \
  --question-tokens 16 --max-tokens 64 --vocab 128000 --concurrency 64 --seed 1 --out "$trace" > /dev/null
status=0
for round in $(seq 1 "${ROUNDS:-2}"); do
  for sd in auto exact off; do
    dir=$out/${sd}_$round
    arg=$sd exact=0
    [[ $sd == exact ]] && arg=auto exact=1
    LAZYKV_SHARED_DECODE_EXACT=$exact timeout 300 lazykv-bench compare --worker "$bin/lazykv-worker" \
      --trace "$trace" --modes lazy --model synthetic:llama3-8b --worker-arg --kv-pool --worker-arg 50GiB \
      --worker-arg --shared-decode --worker-arg "$arg" --out-dir "$dir" > "$dir.txt" 2>&1 || status=1
    echo "== --shared-decode $sd, round $round"
    grep -E -A1 "^mode" "$dir.txt"
    grep -h "backend:" "$dir"/worker-*.log | sed 's/.*backend: //' | cut -c1-160
    find "$dir" -name "*.jsonl" -delete
    rm -rf "$dir"/cache-*
  done
done
rm -f "$trace"
exit $status
