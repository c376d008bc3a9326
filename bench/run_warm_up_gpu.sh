#!/usr/bin/env bash
# On the GPU machine: what the backend warm-up (Backend::WarmUp) changes, in one call.
# The in-process benchmark with its modes in both orders without the warm-up (the later mode
# meets the step shapes the earlier one planned: the order effect), then with it; the served
# run (bench/run_served_tier_gpu.sh "served"), whose workers warm up before serving; the
# warm-up's GPU test. Results: bench/results/served_2026-11-27.md.
# usage: [PARTS="served warm"] bench/run_warm_up_gpu.sh BUNDLE_DIR OUT_DIR   (PARTS: run_served_tier_gpu.sh's)
set -uo pipefail
bundle=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
source "$bundle/env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
echo "== cuda_warm_up_test"
timeout 120 cuda_warm_up_test > "$out/cuda_warm_up_test.txt" 2>&1
echo "rc=$?"
grep -E "^\[  (PASSED|FAILED) |OK \]|FAILED \]|GEMM shapes" "$out/cuda_warm_up_test.txt"
inproc() {  # name, then cuda_backend_bench arguments
  local name=$1
  shift
  echo "== in-process $name"
  timeout 240 cuda_backend_bench --e2e-batched --requests 160 --max-tokens 64 --max-concurrency 64 "$@" \
    --out "$out/inproc_$name.json" > "$out/inproc_$name.txt" 2>&1
  echo "rc=$?"
  grep -E "^(mode|block|lazy) |lazy over block|^backend:|backend warm-up" "$out/inproc_$name.txt"
}
inproc cold_block_first --modes block,lazy --no-backend-warm-up
inproc cold_lazy_first --modes lazy,block --no-backend-warm-up
inproc warm --modes block,lazy
inproc warm_lazy_first --modes lazy,block
bash "$bundle/data/run_served_tier_gpu.sh" "$bundle" "$out/served" "${PARTS:-served}"
# The served runs' tables and worker logs in one file (the device tool fetches flat folders).
(cd "$out" && find served -name "*.txt" -o -name "*.log" | tar czf served_logs.tgz -T -)
