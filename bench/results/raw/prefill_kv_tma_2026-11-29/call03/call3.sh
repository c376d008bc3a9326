#!/usr/bin/env bash
# Issue 25, session 27, call 3: the copy warps' loop compiled apart for launches with and without
# the pools' tensor maps; cuda_prefill_bench against main (eaeb630) and LAZYKV_PREFILL_KV_TMA=0; the
# Zipf trace in process (cuda_backend_bench --e2e-batched) and served (lazykv-bench compare, lazy and
# block, the default tier) with and without the TMA copies.
set -u
source pc-bundle/env.sh
export LAZYKV_MODELS_DIR=pc-bundle/data
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/device.txt; date -u | tee -a $L/device.txt
SECONDS=0
timeout 200 cuda_prefill_test > $L/cuda_prefill_test.log 2>&1
echo "cuda_prefill_test rc=$? ${SECONDS}s: $(grep -E '^\[  PASSED|^\[  FAILED' $L/cuda_prefill_test.log | tr '\n' ' ')"
row() {  # $1: log
  echo "$(grep -E '^full ' $1 | awk '{print "default", $8, "norot", $9, "rot", $10}') | one-tile $(grep -E 'schedule 2:' $1 | sed -E 's/.*lazy [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/' | head -1) | backend bf16 $(grep -E "backend's launch, output in bf16" $1 | sed -E 's/.*bf16: [0-9.]+ ms, ([0-9.]+) TFLOP.*/\1/' | head -1)"
}
for len in 16384 4096 1024; do
  for v in main tma0 new; do
    f=$L/${v}_b${len}.txt
    case $v in
      main) timeout 60 main_cuda_prefill_bench $len full > $f 2>&1 ;;
      tma0) LAZYKV_PREFILL_KV_TMA=0 timeout 60 cuda_prefill_bench $len full > $f 2>&1 ;;
      new) timeout 60 cuda_prefill_bench $len full > $f 2>&1 ;;
    esac
    echo "$len $v rc=$?: $(row $f)"
  done
done
for tma in 0 1; do
  LAZYKV_PREFILL_KV_TMA=$tma timeout 150 cuda_backend_bench --e2e-batched --modes block,lazy --max-concurrency 64 > $L/e2e_tma$tma.txt 2>&1
  echo "e2e tma=$tma rc=$? ${SECONDS}s"; grep -E "^(block|lazy) +[0-9]" $L/e2e_tma$tma.txt | head -2; grep -E "lazy over block" $L/e2e_tma$tma.txt | head -1
done
bin=$(dirname "$(command -v lazykv-worker)")
trace=/tmp/trace_c64.jsonl
lazykv-bench trace --docs 100 --docs-per-request 8 --zipf-s 1.1 --requests 160 --doc-lengths fixed:512 \
  --question-tokens 16 --max-tokens 64 --vocab 128000 --concurrency 64 --seed 1 --out "$trace" > /dev/null
for tma in 0 1; do
  d=/tmp/served_tma$tma
  LAZYKV_PREFILL_KV_TMA=$tma timeout 170 lazykv-bench compare --worker "$bin/lazykv-worker" --trace "$trace" --modes lazy,block \
    --model synthetic:llama3-8b --worker-arg --kv-pool --worker-arg 50GiB --out-dir $d > $L/served_tma$tma.txt 2>&1
  echo "served tma=$tma rc=$? ${SECONDS}s"; grep -E -A2 "^mode" $L/served_tma$tma.txt; grep -E "lazy over block" $L/served_tma$tma.txt | head -1
  gzip -c $d/compare.json > $L/served_tma$tma.json.gz 2>/dev/null; rm -rf $d
done
echo "done ${SECONDS}s"
for f in $L/cuda_prefill_test.log $L/e2e_tma*.txt; do xz -9 $f; done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
