#!/usr/bin/env bash
# Issue 25, session 21, call 7: the final code (HEAD) against main (54694fe): tests; the whole prefill table with SDPA;
# the Zipf trace in process and served, alternated with main.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
for t in cuda_prefill_test cuda_backend_test; do
  timeout 150 $t > $L/$t.log 2>&1; echo "$t rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]" $L/$t.log | head -8
done
grep -E "own_keys_jump_mid_tile seq" $L/cuda_prefill_test.log | awk '{print $NF}' | sort -g | tail -1 | sed 's/^/worst jump_mid_tile rel error: /'
timeout 120 cuda_prefill_bench > $L/bench_all.txt 2>&1; echo "whole table rc=$? ${SECONDS}s"
grep -E "^(full|last) |backend's launch, output|persistent kernel, q rotated" $L/bench_all.txt | cut -c1-200
timeout 150 python3 pc-bundle/data/sdpa_prefill_reference.py --prefill-log $L/bench_all.txt > $L/sdpa.txt 2>&1
echo "SDPA rc=$? ${SECONDS}s"; sed -n '/prefill ratios/,$p' $L/sdpa.txt | head -14
for r in 1 2; do
  for v in main new; do
    b=cuda_backend_bench; [[ $v == main ]] && b=main_cuda_backend_bench
    timeout 60 $b --e2e-batched --modes block,lazy --max-concurrency 64 > $L/e2e_${v}_$r.txt 2>&1; echo "e2e $v r$r rc=$? ${SECONDS}s"
    grep -E "^(block|lazy) +[0-9]" $L/e2e_${v}_$r.txt | head -2
  done
done
bin=$(dirname "$(command -v lazykv-worker)")
trace=/tmp/trace_c64.jsonl
lazykv-bench trace --docs 100 --docs-per-request 8 --zipf-s 1.1 --requests 160 --doc-lengths fixed:512 \
  --question-tokens 16 --max-tokens 64 --vocab 128000 --concurrency 64 --seed 1 --out "$trace" > /dev/null
for r in 1 2; do
  for v in main new; do
    w=lazykv-worker; [[ $v == main ]] && w=main_lazykv-worker
    d=/tmp/served_${v}_$r
    timeout 150 lazykv-bench compare --worker "$bin/$w" --trace "$trace" --modes lazy,block \
      --model synthetic:llama3-8b --worker-arg --kv-pool --worker-arg 50GiB --out-dir $d > $L/served_${v}_$r.txt 2>&1
    echo "served $v r$r rc=$? ${SECONDS}s"; grep -E -A2 "^mode" $L/served_${v}_$r.txt
    gzip -c $d/compare.json > $L/served_${v}_$r.json.gz 2>/dev/null; rm -rf $d
  done
done
xz -9 $L/cuda_prefill_test.log
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
