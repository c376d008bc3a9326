#!/usr/bin/env bash
# Cold against warm: the same trace served twice by a fresh lazykv-worker (lazy mode)
# behind the same cache tier, first empty, then holding every chunk the first run
# published. The second run shows what the tier is worth to a worker that joins a warm
# fleet, and which way the fetch-or-recompute decision went (usage and the log).
# usage: bench/run_tier_warmth.sh BIN_DIR OUT_DIR TRACE TIER [COMPARE ARGS...]
#   TIER: remote (a lazykv-cache-server on 127.0.0.1) or embedded (a shared --cache-dir)
#   COMPARE ARGS: lazykv-bench compare's, e.g. --model M --tokenizer T --worker-arg --kv-pool --worker-arg 1GiB
#   CACHE_HOST_CAPACITY (environment): the cache server's host RAM (default 4GiB)
#   CACHE_SERVER_ARGS (environment): more cache server flags, e.g. "--gpu-capacity 8GiB"
# Prints one line per run: TTFT p50/p90, req/s, and where document tokens came from.
set -euo pipefail
bin=$1 out=$2 trace=$3 tier=$4
shift 4
mkdir -p "$out"
out=$(cd "$out" && pwd)
compare_args=("$@")
server_pid=
cleanup() { [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null; true; }
trap cleanup EXIT
case $tier in
  remote)
    rm -rf "$out/cache-server"
    "$bin/lazykv-cache-server" --listen 127.0.0.1:0 --data-dir "$out/cache-server" --host-capacity "${CACHE_HOST_CAPACITY:-4GiB}" \
      ${CACHE_SERVER_ARGS:-} \
      > "$out/cache-server.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 100); do grep -q "listening on" "$out/cache-server.log" && break; sleep 0.1; done
    address=$(grep -o "listening on [0-9.:]*" "$out/cache-server.log" | head -1 | awk '{print $3}')
    [[ -n $address ]] || { echo "cache server did not start"; cat "$out/cache-server.log"; exit 1; }
    tier_args=(--worker-arg --cache-servers --worker-arg "$address")
    ;;
  embedded)
    rm -rf "$out/cache-shared"
    tier_args=(--worker-arg --cache-dir --worker-arg "$out/cache-shared")
    ;;
  *) echo "TIER must be remote or embedded"; exit 2 ;;
esac
for run in cold warm; do
  "$bin/lazykv-bench" compare --worker "$bin/lazykv-worker" --trace "$trace" --modes lazy \
    "${tier_args[@]}" "${compare_args[@]}" --out-dir "$out/$run" > "$out/$run.txt" 2>&1 || { cat "$out/$run.txt"; exit 1; }
  /usr/bin/env python3 - "$out/$run/compare.json" "$run" "$tier" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
m = j["modes"][0] if isinstance(j.get("modes"), list) else j
s = m["summary"] if "summary" in m else m
u = s.get("usage", {})
print(f'{sys.argv[3]:8s} {sys.argv[2]:4s}: TTFT p50 {s["ttft_ms"]["p50"]:8.2f} ms  p90 {s["ttft_ms"]["p90"]:8.2f} ms  '
      f'{s["request_throughput"]:6.2f} req/s  usage {json.dumps(u)}')
PY
  grep -h "chunk pipeline:\|fetch cost\|GPU tier" "$out/$run"/worker-lazy.log || true
  grep -A1 "TTFT p50 by the number" "$out/$run.txt" || true
done
