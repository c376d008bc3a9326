#!/usr/bin/env bash
# Issue 25, session 22, call 3: where a cached-document question's prefill CTA spends its ~16 us (the
# packed one-tile kernel, a split of two KV tiles a CTA at batch 1): the in-kernel timeline
# (tl_: a -DLAZYKV_PREFILL_TIMELINE=ON build, q rotated as the backend's launch), read by
# prefill_short_ctas.py; the questions table of the normal build beside it.
set -uo pipefail
bundle=$(cd pc-bundle && pwd)
source "$bundle/env.sh"
logs=$OUT/logs; mkdir -p $logs
start=$(date +%s); el() { echo "$(($(date +%s) - start)) s"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; date -u
timeout 120 cuda_prefill_bench questions > $logs/questions.txt 2>&1; echo "questions rc=$? ($(el))"
sed -n '/^questions/,$p' $logs/questions.txt | head -16
LAZYKV_PREFILL_TIMELINE_OUT=$logs/tl LAZYKV_PREFILL_TIMELINE_Q_ROTATED=1 timeout 120 tl_cuda_prefill_bench questions > $logs/tl_questions.txt 2>&1
echo "timeline rc=$? ($(el))"; grep -E "timeline" $logs/tl_questions.txt
cd $bundle/data && python3 prefill_short_ctas.py $logs/tl_questions_1 $logs/tl_questions_8 2>&1 | tee $logs/short_ctas.txt
for i in 1 2 3; do
  LAZYKV_PREFILL_TIMELINE_OUT=$logs/tl$i LAZYKV_PREFILL_TIMELINE_Q_ROTATED=1 timeout 120 tl_cuda_prefill_bench questions > /dev/null 2>&1
  python3 prefill_short_ctas.py $logs/tl${i}_questions_1 2>&1 | grep -E "global timer|rows written \(|==" 
done
echo "done ($(el))"
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $logs
