#!/usr/bin/env bash
# On the GPU machine: the lazy prefill kernels in one call. The test (every schedule, the
# persistent one on 1 and 3 CTAs), cuda_prefill_bench of this build and of every other build
# packed beside it (*_cuda_prefill_bench, e.g. a branch's or HEAD's, alternated with this one
# twice), SDPA's prefill and the ratios, an ncu profile of the one-tile and persistent kernels
# (warp stall reasons) at 1k and 16k causal, per-instruction stall samples, and the kernels' SASS, whose opcodes extend
# bench/sass_opcodes_sm90.json (the table comes back in OUT_DIR).
# Here: bench/bundle_backend_gpu.sh OUT build cuda_prefill_test cuda_prefill_bench [NAME_cuda_prefill_bench...]
#   && cp bench/run_prefill_gpu.sh bench/cubin_inspect.py bench/sass_opcodes_sm90.json bench/stall_samples.py OUT/data/
# There: bash OUT/data/run_prefill_gpu.sh OUT OUT_DIR   (SKIP_NCU=1, SKIP_SDPA=1, SKIP_SOURCE=1 to leave
# parts out); OUT_DIR holds more files than a device call returns: tar it.
set -uo pipefail
bundle=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
source "$bundle/env.sh"
export LAZYKV_MODELS_DIR=$BUNDLE_DATA
start=$(date +%s)
elapsed() { echo "$(($(date +%s) - start)) s"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 120 cuda_prefill_test > "$out/prefill_test.log" 2>&1
echo "cuda_prefill_test rc=$? ($(elapsed)): $(grep -E '^\[  (PASSED|FAILED)' "$out/prefill_test.log" | tr '\n' ' ')"
grep -E "Failure|FAILED  \]" -A3 "$out/prefill_test.log" | head -20
for s in 2 3; do
  worst=$(grep -E "schedule $s( |,)" "$out/prefill_test.log" | awk '{print $NF}' | sort -g | tail -n 1)
  echo "worst relative error, schedule $s: ${worst:-none}"
done
others=$(ls "$bundle/bin" | grep -E '^.+_cuda_prefill_bench$' || true)
for round in 1 2; do
  for b in cuda_prefill_bench $others; do
    timeout 90 "$b" > "$out/${b}_$round.log" 2>&1
    echo "== $b round $round rc=$? ($(elapsed))"
    grep -E "^(full|last) |schedule [23]|SM clock" "$out/${b}_$round.log" | sed -E 's/; no rotation.*//'
  done
done
if [[ ${SKIP_SDPA:-0} != 1 ]]; then
  timeout 150 python3 "$BUNDLE_DATA/sdpa_prefill_reference.py" --prefill-log "$out/cuda_prefill_bench_1.log" \
    > "$out/sdpa.log" 2>&1
  echo "== SDPA rc=$? ($(elapsed))"
  sed -n '/prefill ratios/,$p' "$out/sdpa.log" | head -12
fi
if [[ ${SKIP_NCU:-0} != 1 ]]; then
  for shape in "1024 full" "16384 full"; do
    for kernel in LazyPrefillSpecializedKernel LazyPrefillPersistentKernel; do
      echo "=== ncu: $kernel, $shape" >> "$out/ncu.txt"
      timeout 150 ncu --clock-control none -k "regex:$kernel" -c 1 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
        --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
        cuda_prefill_bench $shape >> "$out/ncu.txt" 2>&1
    done
  done
  echo "== ncu ($(elapsed))"
  grep -E "=== ncu|Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|issue_stalled_(long_scoreboard|short_scoreboard|wait|mio_throttle|barrier|math_pipe|no_instruction|not_selected|branch|membar|dispatch|sleeping|tex_throttle|lg_throttle)|ERROR|rror" \
    "$out/ncu.txt" | head -90
fi
if [[ ${SKIP_SOURCE:-0} != 1 ]]; then
  # Per-instruction warp-state samples (where each role's warps wait), exported as CSV with the
  # SASS beside each sample: the one-tile kernel at 16k, the persistent one at 1k (causal, full).
  for run in "LazyPrefillSpecializedKernel 16384" "LazyPrefillPersistentKernel 1024"; do
    set -- $run
    timeout 150 ncu --clock-control none -k "regex:$1" -c 1 --section SourceCounters --section WarpStateStats \
      --import-source no -f -o "$out/source_$1_$2" cuda_prefill_bench "$2" full > "$out/source_$1_$2.log" 2>&1
    ncu -i "$out/source_$1_$2.ncu-rep" --page source --csv --print-source sass > "$out/source_$1_$2.csv" 2>&1 ||
      ncu -i "$out/source_$1_$2.ncu-rep" --page source --csv > "$out/source_$1_$2.csv" 2>&1
    echo "== source samples: $1 at $2: $(wc -l < "$out/source_$1_$2.csv") lines ($(elapsed)); per role:"
    python3 "$BUNDLE_DATA/stall_samples.py" "$out/source_$1_$2.csv" 4 | cut -c1-140
  done
fi
cuobjdump -sass "$bundle/bin/cuda_prefill_bench" > "$out/sass_all.txt" 2>&1
cp "$BUNDLE_DATA/sass_opcodes_sm90.json" "$BUNDLE_DATA/cubin_inspect.py" "$out/" 2>/dev/null &&
  python3 "$out/cubin_inspect.py" learn "$out/sass_all.txt"
xz -9 "$out/sass_all.txt"
echo "done ($(elapsed))"
