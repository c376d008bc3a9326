#!/usr/bin/env bash
# On the GPU machine: a few of issue 25's figures against the ceilings in perf_guard.tsv, so a
# change that slows a kernel is seen in the call that measures anything, not days later.
# Runs shared_decode_bench 64 8 100 1.1 (the per-sequence decode kernel at one split, and the
# chunk-shared path beside it), cuda_backend_bench (the batch-1 decode step, the TTFT with
# every document cached) and cuda_prefill_bench at 1k and 16k (causal prefill, the default
# launch: the persistent kernel at 1k, the one-tile kernel at 16k); prints each figure, its ceiling and PASS or FAIL; exits 1 on a FAIL
# or a figure it could not read, 0 otherwise (a device the table does not name: nothing checked).
# Here: bench/bundle_backend_gpu.sh OUT build shared_decode_bench cuda_backend_bench cuda_prefill_bench && cp
#   bench/run_perf_guard_gpu.sh bench/perf_guard.tsv OUT/data/
# There: bash OUT/data/run_perf_guard_gpu.sh OUT LOGDIR
set -uo pipefail
bundle=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
source "$bundle/env.sh"
table=$(dirname "$0")/perf_guard.tsv
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "device: $device"
timeout 200 shared_decode_bench 64 8 100 1.1 > "$out/shared_decode_bench.txt" 2>&1
timeout 300 cuda_backend_bench > "$out/cuda_backend_bench.txt" 2>&1
for len in 1024 16384; do timeout 60 cuda_prefill_bench $len full > "$out/cuda_prefill_bench_$len.txt" 2>&1; done
# The figures, by name (empty where the line is missing).
declare -A got
got[per_sequence_decode_b64]=$(awk '$1 == "per-sequence" {print $3; exit}' "$out/shared_decode_bench.txt")
got[shared_decode_b64]=$(awk '$1 == "shared+side" {print $3; exit}' "$out/shared_decode_bench.txt")
got[decode_step_b1]=$(sed -n 's/^decode step, batch 1, [^:]*: \([0-9.]*\) ms.*/\1/p' "$out/cuda_backend_bench.txt" | head -n 1)
got[cached_ttft_b1]=$(sed -n 's/^TTFT with all [0-9]* documents cached[^:]*: \([0-9.]*\) ms.*/\1/p' "$out/cuda_backend_bench.txt" |
  head -n 1)
got[prefill_full_1k]=$(awk '$1 == "full" && $2 == 1024 {print $6; exit}' "$out/cuda_prefill_bench_1024.txt")
got[prefill_full_16k]=$(awk '$1 == "full" && $2 == 16384 {print $6; exit}' "$out/cuda_prefill_bench_16384.txt")
status=0
checked=0
while IFS=$'\t' read -r figure dev ceiling unit recorded; do
  [[ -z $figure || $figure == \#* ]] && continue
  [[ $device == *"$dev"* ]] || continue
  checked=$((checked + 1))
  value=${got[$figure]:-}
  if [[ -z $value ]]; then
    echo "FAIL $figure: not found in the output (logs in $out)"
    status=1
  elif awk -v v="$value" -v c="$ceiling" 'BEGIN {exit !(v > c)}'; then
    echo "FAIL $figure: $value $unit over the ceiling $ceiling (recorded $recorded)"
    status=1
  else
    echo "PASS $figure: $value $unit (ceiling $ceiling; recorded $recorded)"
  fi
done < "$table"
(( checked == 0 )) && echo "no ceilings for $device in $table: nothing checked"
exit $status
