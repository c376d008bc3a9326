#!/usr/bin/env bash
# Call 4: the short-query kernel (fused score chains, tiles primed before the query loads, 4 stages).
set -u
source pc-bundle/env.sh
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
timeout 200 cuda_prefill_test > $L/prefill_test.log 2>&1; echo "prefill_test rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/prefill_test.log | tr '\n' ' ')"
grep -E "FAILED|Failure" $L/prefill_test.log | head -10
grep "schedule 4" $L/prefill_test.log | awk '{print $NF}' | sort -g | tail -2
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 cuda_prefill_test --gtest_filter='*llama3_question*:*group8_question_hd64*:*group2_question*' > $L/memcheck.log 2>&1; echo "memcheck rc=$? ${SECONDS}s"; grep -E "ERROR SUMMARY|PASSED|FAILED" $L/memcheck.log | head -3
timeout 120 cuda_prefill_bench questions > $L/questions.txt 2>&1; echo "questions rc=$? ${SECONDS}s"; sed -n '/^questions/,$p' $L/questions.txt
for r in 1 2; do for q in 1 0; do
  LAZYKV_PREFILL_QUESTION=$q timeout 150 cuda_backend_bench > $L/backend_q${q}_$r.txt 2>&1; echo "backend q=$q r=$r rc=$? ${SECONDS}s"
  grep -E "^TTFT" $L/backend_q${q}_$r.txt
done; done
timeout 200 ncu --clock-control none -k regex:Question --launch-skip 3 -c 1 --set full -o $L/q cuda_prefill_bench questions > $L/ncu_run.txt 2>&1; echo "ncu rc=$?"
ncu --import $L/q.ncu-rep --page details > $L/q_details.txt 2>&1
grep -E "^    Duration|Achieved Occupancy|DRAM Throughput|Issued Ipc|Warp Cycles Per Issued" $L/q_details.txt | head
ncu --import $L/q.ncu-rep --page source --csv --print-source sass > $L/q_sass.csv 2>$L/q_sass.err
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
