#!/usr/bin/env bash
# On the GPU machine: issue 25's served check at concurrency 1. The data-path issue's Zipf
# RAG trace (8 documents of 512 tokens, 64 tokens out) one request at a time through
# lazykv-worker (lazykv-bench compare, lazy), and in the same call the in-process decode step
# (cuda_backend_bench's decode ceilings), so the served ITL p50 can be held to the step.
# CPU_DMA_LATENCY_US=N holds /dev/cpu_dma_latency at N microseconds during the run (the
# kernel then keeps idle cores out of deeper sleep states), to see how much of the served
# path's transit is thread wake-up. REQUESTS=N replays N requests (default 24). WORKER_CPUS
# and CLIENT_CPUS (taskset lists, e.g. 0-3) pin the worker and the client to those cores, to
# see how much of it is wake-ups across cores. WORKER_BIN names another worker program in the
# bundle (e.g. an earlier build packed beside this one), for A/B runs on one machine; the
# in-process step (INPROCESS) is still the bundle's cuda_backend_bench.
# bench/served_transit.py (in the bundle's data/) splits each request's TTFT into the worker's
# own and the transit.
# usage: bench/run_served_itl_gpu.sh BUNDLE_DIR OUT_DIR
set -uo pipefail
bundle=$(cd "$1" && pwd)
out=$(mkdir -p "$2" && cd "$2" && pwd)  # absolute: the script works from /tmp below
source "$bundle/env.sh"
bin=$(dirname "$(command -v lazykv-worker)")
cd /tmp
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
holder=
trap '[[ -n $holder ]] && kill "$holder" 2> /dev/null' EXIT
if [[ -n ${CPU_DMA_LATENCY_US:-} ]]; then
  [[ $CPU_DMA_LATENCY_US =~ ^[0-9]+$ ]] || { echo "CPU_DMA_LATENCY_US: a number of microseconds" >&2; exit 2; }
  python3 -c "import signal, struct; f = open('/dev/cpu_dma_latency', 'wb', 0); f.write(struct.pack('i', $CPU_DMA_LATENCY_US)); signal.pause()" &
  holder=$!
  sleep 1
  if kill -0 "$holder" 2> /dev/null; then
    echo "cpu_dma_latency held at ${CPU_DMA_LATENCY_US} us (pid $holder)"
  else
    echo "cpu_dma_latency could not be held: the run goes on without it" >&2
    holder=
  fi
fi
for cpus in "${WORKER_CPUS:-}" "${CLIENT_CPUS:-}"; do
  [[ -z $cpus || $cpus =~ ^[0-9,-]+$ ]] || { echo "WORKER_CPUS / CLIENT_CPUS: a taskset list such as 0-3" >&2; exit 2; }
done
# lazykv-bench starts the worker, which would inherit the client's pinning: with CLIENT_CPUS
# alone the worker gets every core back.
[[ -n ${CLIENT_CPUS:-} && -z ${WORKER_CPUS:-} ]] && WORKER_CPUS=0-$(($(nproc --all) - 1))
worker=$bin/${WORKER_BIN:-lazykv-worker}
[[ -x $worker ]] || { echo "$worker: not in the bundle" >&2; exit 2; }
if [[ -n ${WORKER_CPUS:-} ]]; then  # through a pinning wrapper
  printf '#!/usr/bin/env bash\nexec taskset -c %s %q "$@"\n' "$WORKER_CPUS" "$worker" > "$out/pinned-worker.sh"
  worker=$out/pinned-worker.sh
  chmod +x "$worker"
fi
client=(); [[ -n ${CLIENT_CPUS:-} ]] && client=(taskset -c "$CLIENT_CPUS")
trace=$out/trace_c1.jsonl
lazykv-bench trace --docs 100 --docs-per-request 8 --zipf-s 1.1 --requests "${REQUESTS:-24}" --doc-lengths fixed:512 \
  --question-tokens 16 --max-tokens 64 --vocab 128000 --concurrency 1 --seed 1 --out "$trace"
timeout 300 "${client[@]}" lazykv-bench compare --worker "$worker" --trace "$trace" --modes lazy \
  --model synthetic:llama3-8b --worker-arg --kv-pool --worker-arg 20GiB --out-dir "$out/served_c1" \
  > "$out/served_c1.txt" 2>&1
echo "served rc=$?"
grep -A4 "^mode" "$out/served_c1.txt"
grep -h "backend:" "$out/served_c1"/worker-*.log
[[ -f $bundle/data/served_transit.py ]] && python3 "$bundle/data/served_transit.py" "$out/served_c1/compare.json"
if [[ ${INPROCESS:-1} == 1 ]]; then  # INPROCESS=0 leaves the in-process step out
  timeout 300 cuda_backend_bench > "$out/cuda_backend_bench.txt" 2>&1
  echo "in-process rc=$?"
  grep -E "decode step|backend:|GEMMs at 1 row" "$out/cuda_backend_bench.txt"
fi
# What comes back from the machine is bounded: the trace and the per-request records (large,
# and made again from the same seed) are left out, the summaries and the worker's log kept.
rm -f "$trace"
find "$out" -type f -size +512k -print -delete
