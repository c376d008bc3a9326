#!/usr/bin/env bash
# Issue 25, session 20, call 2: the long-prefill rule (persistent kernel where queries >= keys / 2): tests, 2k-16k;
# the deferred box stores (dp_) against new at 1k, alternated; the Zipf trace in process; the served path
# (lazykv-worker, default tier) with the bf16 output on and off, and main's worker.
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
for shape in "2048 full" "4096 full" "16384 full" "4096 last"; do
  f=$L/bench_${shape// /_}.txt
  timeout 60 cuda_prefill_bench $shape > $f 2>&1; echo "$shape rc=$? ${SECONDS}s"
  grep -E "^(full|last) |backend's launch, output|persistent kernel, q rotated" $f | cut -c1-210
done
for r in 1 2 3; do
  for v in "" dp_; do
    timeout 40 ${v}cuda_prefill_bench 1024 full > $L/${v}b1k_$r.txt 2>&1; echo "${v:-new} 1k r$r rc=$? ${SECONDS}s: $(grep -E "backend's launch, output" $L/${v}b1k_$r.txt | cut -c1-100)"
  done
done
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
  for v in bf161 bf160 main; do
    w=lazykv-worker; [[ $v == main ]] && w=main_lazykv-worker
    bf=1; [[ $v == bf160 ]] && bf=0
    d=/tmp/served_${v}_$r
    LAZYKV_PREFILL_OUT_BF16=$bf timeout 150 lazykv-bench compare --worker "$bin/$w" --trace "$trace" --modes lazy,block \
      --model synthetic:llama3-8b --worker-arg --kv-pool --worker-arg 50GiB --out-dir $d > $L/served_${v}_$r.txt 2>&1
    echo "served $v r$r rc=$? ${SECONDS}s"; grep -E -A2 "^mode" $L/served_${v}_$r.txt
    gzip -c $d/compare.json > $L/served_${v}_$r.json.gz 2>/dev/null; rm -rf $d
  done
done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
