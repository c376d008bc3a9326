#!/usr/bin/env bash
# On the GPU machine, from the repository root: correctness, the decode benchmark (with the
# launch-configuration sweep), SDPA's decode, an ncu profile and the SASS of the kernel.
# usage: bench/run_decode_gpu.sh BUNDLE_DIR [OUT_DIR]   (BUNDLE_DIR made by gpu-bundle)
set -uo pipefail
bundle=$1
out=${2:-${OUT:-/tmp/decode_out}}
mkdir -p "$out"
source "$bundle/env.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee "$out/gpu.txt"
cuda_kernels_test 2>&1 | tee "$out/test.log" | grep -E "OK|FAILED|PASSED|worst|Failure" | head -60
cuda_decode_bench $([[ ${SWEEP:-1} == 1 ]] && echo --sweep) 2>&1 | tee "$out/decode.log"
PYTHONUNBUFFERED=1 python3 "$BUNDLE_DATA/sdpa_prefill_reference.py" --decode-only --decode-log "$out/decode.log" \
  2>&1 | tee "$out/sdpa.log" | tail -14
if [[ ${SKIP_NCU:-0} != 1 ]]; then
  for shape in "32 16384" "1 32768"; do
    echo "=== ncu: batch/context $shape" >> "$out/ncu.txt"
    timeout 150 ncu --clock-control none -k regex:DecodeSplitKernel -c 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section WarpStateStats --section SchedulerStats --section LaunchStats \
      --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
      cuda_decode_bench --profile $shape >> "$out/ncu.txt" 2>&1
  done
  grep -E "=== ncu|DecodeSplitKernel<|Duration|DRAM Throughput|Achieved Occupancy|Issue Slots Busy|No Eligible|Eligible Warps|Warp Cycles Per Issued|issue_stalled_(long_scoreboard|short_scoreboard|wait|mio_throttle|lg_throttle|barrier|math_pipe|no_instruction|not_selected|branch|membar|dispatch)|Executed Ipc A|ERROR|rror" "$out/ncu.txt" | head -70
fi
if [[ ${SANITIZE:-1} == 1 ]]; then
  timeout 200 compute-sanitizer --tool memcheck cuda_kernels_test \
    --gtest_filter=${MEMCHECK_FILTER:-'*group3*:*hd64_group8*:*group2_block7*:*splits3*:*batch1_chunks8*'} > "$out/memcheck.log" 2>&1
  tail -4 "$out/memcheck.log"
fi
if [[ ${SKIP_SASS:-0} != 1 ]]; then
  cuobjdump -sass "$bundle/bin/cuda_decode_bench" > "$out/sass_all.txt" 2>&1
  python3 - "$out/sass_all.txt" > "$out/sass_mix.txt" <<'PY'
import re, sys, collections
text = open(sys.argv[1]).read()
for m in re.finditer(r"Function : (\S+)\n(.*?)(?=\n\s*Function : |\Z)", text, re.S):
    name, body = m.group(1), m.group(2)
    if "DecodeSplitKernelILi128ELi4ELi4ELi3" not in name:
        continue
    ops = collections.Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", body))
    open(sys.argv[1].replace("sass_all", "sass_kernel"), "w").write(name + "\n" + body)
    print(name, sum(ops.values()), "instructions")
    for op, n in ops.most_common(40):
        print(f"{op:12s} {n}")
PY
  head -45 "$out/sass_mix.txt"
  rm -f "$out/sass_all.txt"
fi
