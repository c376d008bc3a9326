#!/usr/bin/env bash
# Issue 25, session 22, call 8: call 6's Zipf-trace gain attributed: the new build with its one-tile work
# starts on and off (LAZYKV_PREFILL_WORK_STARTS=1 / 0) and main's build, in turn, main first in round 1
# and last in round 2.
set -uo pipefail
bundle=$(cd pc-bundle && pwd)
source "$bundle/env.sh"
export LAZYKV_MODELS_DIR=$BUNDLE_DATA
logs=$OUT/logs; mkdir -p $logs
start=$(date +%s); el() { echo "$(($(date +%s) - start)) s"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
run() {  # name binary starts round
  LAZYKV_PREFILL_WORK_STARTS=$3 timeout 100 $2 --e2e-batched --modes block,lazy --max-concurrency 64 > $logs/$1_$4.txt 2>&1
  echo "r$4 $1 rc=$? ($(el)): $(grep -E 'mode lazy: 256' $logs/$1_$4.txt | sed -E 's/.*requests in ([0-9.]+) s.*steps of ([0-9.]+) ms on average.* in ([0-9.]+) ms/\1 s, steps \2 ms, decode-only \3 ms/') | $(grep -E '^lazy +[0-9]' $logs/$1_$4.txt | awk '{print "req/s", $5, "ttft p50", $3}')"
}
run main main_cuda_backend_bench 1 1; run new_on cuda_backend_bench 1 1; run new_off cuda_backend_bench 0 1
run new_off cuda_backend_bench 0 2; run new_on cuda_backend_bench 1 2; run main main_cuda_backend_bench 1 2
echo "done ($(el))"
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $logs
