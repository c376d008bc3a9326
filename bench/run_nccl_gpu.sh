#!/usr/bin/env bash
# On a machine with two GPUs (issue 18), in one call: the NCCL link's GPU tests
# (cuda_nccl_peer_link_test, cuda_nccl_tier_test) and the GPU tier's (cuda_gpu_tier_test),
# nccl_transfer_bench (64 MiB chunks GPU 0 -> GPU 1 over the link against raw NCCL
# send/receive and cudaMemcpyPeer), gpu_tier_fetch_bench with --nccl-device 1 (whole fetches
# from a cache server's GPU tier on GPU 0 into GPU 1), then the served Zipf trace: one cache
# server with a GPU tier on GPU 0; worker A on GPU 0 serves the trace cold (computes and
# publishes every document); worker B on GPU 1 serves it again, fetching over NCCL
# (--transport nccl), and worker C on GPU 1 serves it with no cache tier (recompute); worker
# D on GPU 1 with the default transport (auto: CUDA IPC, GPU 0 being visible to it). Then the
# same at a fixed open-loop rate (30 requests/s, which recompute sustains), where TTFT
# compares at equal load. Fleet compute of A and B together: document tokens they prefilled
# over the distinct ones.
# Results: bench/results/nccl_<date>.md.
# usage: bench/run_nccl_gpu.sh BUNDLE_DIR OUT_DIR
set -uo pipefail
bundle=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
source "$bundle/env.sh"
export NCCL_NVLS_ENABLE=0  # never NVLink multicast on these shared machines
bin=$(dirname "$(command -v lazykv-worker)")
export LAZYKV_CACHE_SERVER=$bin/lazykv-cache-server
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
nvidia-smi topo -m | tee -a "$out/gpu.txt"
# SERVED=0: the tests and benchmarks alone; TESTS=0: the served runs alone.
if [[ ${TESTS:-1} == 1 ]]; then
for t in cuda_nccl_peer_link_test cuda_nccl_tier_test cuda_gpu_tier_test; do
  echo "== $t"
  (cd /tmp && timeout 240 "$t") > "$out/$t.txt" 2>&1
  echo "rc=$?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |OK \]|FAILED \]|SKIPPED \]|Failure|Expected|Which is|warm engine" "$out/$t.txt" | head -40
done
echo "== nccl_transfer_bench"
(cd /tmp && timeout 180 nccl_transfer_bench --chunk-mib 64 --iterations 50 --warmup 5 --piece-mib 2 --json "$out/nccl_transfer.json") \
  2>&1 | tee "$out/nccl_transfer_bench.txt" | grep -v "^NCCL INFO"
echo "== gpu_tier_fetch_bench --nccl-device 1"
(cd /tmp && timeout 240 gpu_tier_fetch_bench --server "$bin/lazykv-cache-server" --chunks 6 --rounds 5 --nccl-device 1) \
  > "$out/gpu_tier_fetch_bench.txt" 2>&1
echo "rc=$?"
grep -v "^\[" "$out/gpu_tier_fetch_bench.txt" | grep -v "NCCL INFO"
fi

[[ ${SERVED:-1} == 1 ]] || exit 0
work=/tmp/nccl_run
rm -rf "$work"
mkdir -p "$work"
trace=$work/trace.jsonl
lazykv-bench trace --docs 100 --docs-per-request 8 --zipf-s 1.1 --requests 160 --doc-lengths fixed:512 \
  --question-tokens 16 --max-tokens 64 --vocab 128000 --concurrency 64 --seed 1 --out "$trace"
CUDA_VISIBLE_DEVICES=0,1 "$bin/lazykv-cache-server" --listen 127.0.0.1:0 --data-dir "$work/cache-server" \
  --host-capacity 16GiB --gpu-capacity 12GiB --gpu-device 0 > "$work/cache-server.log" 2>&1 &
server_pid=$!
trap 'kill $server_pid 2>/dev/null' EXIT
for _ in $(seq 300); do grep -q "listening on" "$work/cache-server.log" && break; sleep 0.1; done
address=$(grep -o "listening on [0-9.:]*" "$work/cache-server.log" | head -1 | awk '{print $3}')
[[ -n $address ]] || { echo "cache server did not start"; cat "$work/cache-server.log"; exit 1; }
grep -h "GPU tier\|peer links" "$work/cache-server.log"
model=(--model synthetic:llama3-8b --worker-arg --kv-pool --worker-arg 30GiB)
summary() {
  /usr/bin/env python3 - "$1/compare.json" "$2" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
m = j["modes"][0] if isinstance(j.get("modes"), list) else j
s = m["summary"] if "summary" in m else m
u = s.get("usage", {})
print(f'{sys.argv[2]:28s}: TTFT p50 {s["ttft_ms"]["p50"]:8.2f} ms  p90 {s["ttft_ms"]["p90"]:8.2f} ms  '
      f'{s["request_throughput"]:6.2f} req/s  fleet {s.get("fleet_compute", -1):.4f}  usage {json.dumps(u)}')
PY
}
run() {  # NAME VISIBLE_DEVICES WORKER_ARGS...
  local name=$1 devices=$2
  shift 2
  CUDA_VISIBLE_DEVICES=$devices timeout 300 lazykv-bench compare --worker "$bin/lazykv-worker" --trace "$trace" --modes lazy \
    "${model[@]}" "$@" --out-dir "$work/$name" > "$work/$name.txt" 2>&1 || { echo "$name failed"; tail -30 "$work/$name.txt"; }
  summary "$work/$name" "$name" | tee -a "$out/served.txt"
  grep -h "chunk pipeline:\|fetch cost\|peer link\|transport" "$work/$name"/worker-lazy.log | cut -c1-300 | head -6
}
echo "== served: GPU 0 cold, then GPU 1 over NCCL, GPU 1 recompute"
run a_gpu0_cold 0 --worker-arg --cache-servers --worker-arg "$address"
run b_gpu1_nccl_warm 1,0 --worker-arg --cache-servers --worker-arg "$address" --worker-arg --transport --worker-arg nccl
run c_gpu1_recompute 1 --worker-arg --no-cache-tier
run d_gpu1_auto_warm 1,0 --worker-arg --cache-servers --worker-arg "$address"
# Every chunk fetched (the decision overruled): what the link carries when nothing is recomputed.
run b2_gpu1_nccl_warm_always 1,0 --worker-arg --cache-servers --worker-arg "$address" --worker-arg --transport \
  --worker-arg nccl --worker-arg --fetch-policy --worker-arg always
fleet() {  # A B: both workers' document tokens prefilled over the distinct ones
  /usr/bin/env python3 - "$work/$1/compare.json" "$work/$2/compare.json" <<'PY'
import json, sys
def s(p):
    j = json.load(open(p)); m = j["modes"][0] if isinstance(j.get("modes"), list) else j
    return m["summary"] if "summary" in m else m
a, b = s(sys.argv[1]), s(sys.argv[2])
ua, ub = a["usage"], b["usage"]
distinct = ua["document_computed_tokens"] / a["fleet_compute"] if a["fleet_compute"] else 0
print(f"fleet compute of both workers: {(ua['document_computed_tokens'] + ub['document_computed_tokens']) / distinct:.4f} "
      f"({ua['document_computed_tokens']} + {ub['document_computed_tokens']} document tokens prefilled, {distinct:.0f} distinct)")
PY
}
fleet a_gpu0_cold b_gpu1_nccl_warm | tee -a "$out/served.txt"
fleet a_gpu0_cold b2_gpu1_nccl_warm_always | tee -a "$out/served.txt"
echo "== served, open loop at 30 requests/s"
lazykv-bench trace --docs 100 --docs-per-request 8 --zipf-s 1.1 --requests 300 --doc-lengths fixed:512 \
  --question-tokens 16 --max-tokens 64 --vocab 128000 --rate 30 --seed 1 --out "$trace"
run e_open_gpu0_a 0 --worker-arg --cache-servers --worker-arg "$address"
run f_open_gpu1_nccl_warm 1,0 --worker-arg --cache-servers --worker-arg "$address" --worker-arg --transport --worker-arg nccl
run g_open_gpu1_recompute 1 --worker-arg --no-cache-tier
run f2_open_gpu1_nccl_warm_always 1,0 --worker-arg --cache-servers --worker-arg "$address" --worker-arg --transport \
  --worker-arg nccl --worker-arg --fetch-policy --worker-arg always
grep -h "peer link" "$work/cache-server.log" | head -5
(cd "$work" && find . -name "*.log" -o -name "*.txt" -o -name "compare.json" | tar czf "$out/logs.tgz" -T -)
