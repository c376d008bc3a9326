#!/usr/bin/env bash
# Issue 25, session 20, call 4: a step's few-query prefill sequences as their own launch (LAZYKV_PREFILL_TWO_LAUNCHES):
# tests (the new FewQuerySequencesBesideLongOnesEqualTheCpu); the Zipf trace in process, main against this with the
# split on and off; the served trace with it on and off.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for t in cuda_backend_test cuda_prefill_test; do
  timeout 200 $t > $L/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]|two prefill launches" $L/$t.log | head -12
done
for r in 1 2; do
  for v in main on off; do
    b=cuda_backend_bench; [[ $v == main ]] && b=main_cuda_backend_bench
    tl=1; [[ $v == off ]] && tl=0
    LAZYKV_PREFILL_TWO_LAUNCHES=$tl timeout 60 $b --e2e-batched --modes block,lazy --max-concurrency 64 > $L/e2e_${v}_$r.txt 2>&1; echo "e2e $v r$r rc=$? ${SECONDS}s"
    grep -E "^(block|lazy) +[0-9]" $L/e2e_${v}_$r.txt | head -2
  done
done
bin=$(dirname "$(command -v lazykv-worker)")
trace=/tmp/trace_c64.jsonl
lazykv-bench trace --docs 100 --docs-per-request 8 --zipf-s 1.1 --requests 160 --doc-lengths fixed:512 \
  --question-tokens 16 --max-tokens 64 --vocab 128000 --concurrency 64 --seed 1 --out "$trace" > /dev/null
for r in 1 2; do
  for v in on off; do
    tl=1; [[ $v == off ]] && tl=0
    d=/tmp/served_${v}_$r
    LAZYKV_PREFILL_TWO_LAUNCHES=$tl timeout 150 lazykv-bench compare --worker "$bin/lazykv-worker" --trace "$trace" --modes lazy,block \
      --model synthetic:llama3-8b --worker-arg --kv-pool --worker-arg 50GiB --out-dir $d > $L/served_${v}_$r.txt 2>&1
    echo "served $v r$r rc=$? ${SECONDS}s"; grep -E -A2 "^mode" $L/served_${v}_$r.txt; rm -rf $d
  done
done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
