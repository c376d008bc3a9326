#!/usr/bin/env bash
# On the GPU machine: where the served path's gRPC hops go (issue 25, the served TTFT's
# transit, ~0.7 ms on the H100 host against ~0.2 on the development VM), in one call.
#  1. bench/grpc_stream_bench (no model, no GPU): gRPC's sync and callback server APIs on the
#     worker's streamed-reply shape, with the sync server's completion queues at gRPC's
#     default (one a core) and at 1 and 2 (--sync-cqs), alternated, ROUNDS times;
#  2. the served check at concurrency 1 (bench/run_served_itl_gpu.sh, INPROCESS=0) with the
#     worker's LAZYKV_GRPC_SYNC_CQS unset and at each of SERVED_CQS (default "1"), each
#     followed by bench/served_transit.py's split of the transit.
# Here: bundle grpc_stream_bench, lazykv-worker and lazykv-bench, and copy this script,
# run_served_itl_gpu.sh and served_transit.py to the bundle's data/.
# usage: bench/run_grpc_hops_gpu.sh BUNDLE_DIR OUT_DIR
set -uo pipefail
bundle=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
source "$bundle/env.sh"
nproc | sed 's/^/cores: /' | tee "$out/cores.txt"
status=0
for round in $(seq 1 "${ROUNDS:-2}"); do
  for cqs in 0 1 2; do
    log="$out/grpc_stream_cqs${cqs}_$round.txt"
    timeout 120 grpc_stream_bench --requests "${REQUESTS:-200}" --sync-cqs "$cqs" > "$log" 2>&1 || status=1
    echo "== grpc_stream_bench --sync-cqs $cqs (0: gRPC's default), round $round"
    tail -n 3 "$log"
  done
done
for cqs in default ${SERVED_CQS:-1}; do
  dir="$out/served_cqs_$cqs"
  if [[ $cqs == default ]]; then
    INPROCESS=0 bash "$bundle/data/run_served_itl_gpu.sh" "$bundle" "$dir" > "$dir.txt" 2>&1 || status=1
  else
    LAZYKV_GRPC_SYNC_CQS=$cqs INPROCESS=0 bash "$bundle/data/run_served_itl_gpu.sh" "$bundle" "$dir" > "$dir.txt" 2>&1 ||
      status=1
  fi
  echo "== served, LAZYKV_GRPC_SYNC_CQS=$cqs"
  grep -E "served rc|transit|ITL" "$dir.txt" | head -n 6
done
exit $status
