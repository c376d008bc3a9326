#!/usr/bin/env bash
# shellcheck disable=SC2154  # NAME_ADDR and NAME_METRICS are set by start (lib.sh)
# Captures real /metrics pages of lazykv-worker and lazykv-cache-server on loopback, after
# traffic that makes every metric family appear (including those prometheus-cpp only
# exports after their first event: refused calls, invalid-chunk reports, error outcomes),
# for scripts/check_dashboards.py --scrape.
#
#   deploy/local/capture_scrapes.sh [OUT_DIR]     (default deploy/local/scrapes)
#
# Writes OUT_DIR/worker.prom, worker-mac.prom, cache-1.prom, cache-2.prom. Needs the built
# binaries (build/bin) and curl; about 15 s. Everything runs on 127.0.0.1 and is stopped at exit.
#
# What runs:
#   cache-1     plaintext, no tokens, 2 MiB host RAM (so chunks are demoted to disk and promoted)
#   cache-2     plaintext, --auth-tokens (the worker role for tier calls, admin for /metrics)
#   worker      --auth-tokens, both cache servers with a worker token, a 2 MiB KV pool (chunks
#               leave the pool and come back from the tier), an idle watch (--idle-spin-us, off
#               on a CPU by default); a Zipf trace through lazykv-bench, again with documents
#               as text (tokenized, then from the token cache), then calls without a token,
#               with the wrong role and with a bad max_tokens
#   worker-bad-role, worker-no-token   send a client token / no token to cache-2 (refused there)
#   worker-mac  --chunk-mac-key-file: refuses the unsigned chunks it fetches and reports them
#   worker-2    loads a fresh trace at the same time as worker, so the tier's leases are waited on
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$ROOT/deploy/local/scrapes}
STATE=$(mktemp -d /tmp/lazykv-capture.XXXXXX)
PIDS=()
# shellcheck source=deploy/local/lib.sh
source "$ROOT/deploy/local/lib.sh"
trap 'stop_all; rm -rf "$STATE"' EXIT
mkdir -p "$OUT"
model_args

# Tokens: "TOKEN NAME ROLE" (16+ printable characters each).
tok() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
for role in client worker admin; do tok >"$STATE/$role.token"; done
{
  for role in client worker admin; do echo "$(cat "$STATE/$role.token") dev-$role $role"; done
} >"$STATE/tokens"
head -c 48 /dev/urandom >"$STATE/mac.key"
AUTH_ADMIN=(-H "Authorization: Bearer $(cat "$STATE/admin.token")")

start cache1 "$BIN/lazykv-cache-server" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --data-dir "$STATE/cache1" --host-capacity 2MiB --disk-capacity 256MiB
start cache2 "$BIN/lazykv-cache-server" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --data-dir "$STATE/cache2" --host-capacity 64MiB --disk-capacity 256MiB --auth-tokens "$STATE/tokens"
CACHES="$cache1_ADDR,$cache2_ADDR"

start worker "$BIN/lazykv-worker" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 "${MODEL_ARGS[@]}" \
  --kv-pool 2MiB --auth-tokens "$STATE/tokens" --cache-servers "$CACHES" \
  --cache-auth-token "$STATE/worker.token" --idle-spin-us 200

"$BIN/lazykv-bench" trace --docs 40 --docs-per-request 4 --doc-lengths uniform:48:96 --requests 150 \
  --concurrency 4 --max-tokens 24 --seed 1 --out "$STATE/trace1.jsonl" >/dev/null
"$BIN/lazykv-bench" trace --docs 30 --docs-per-request 4 --doc-lengths uniform:48:96 --requests 60 \
  --concurrency 4 --max-tokens 16 --seed 2 --out "$STATE/trace2.jsonl" >/dev/null
"$BIN/lazykv-bench" trace --docs 20 --docs-per-request 4 --doc-lengths uniform:48:96 --requests 40 \
  --concurrency 4 --max-tokens 8 --seed 3 --out "$STATE/trace-text.jsonl" >/dev/null
head -n 8 "$STATE/trace1.jsonl" >"$STATE/trace-small.jsonl"

log "load: 150 requests through worker"
"$BIN/lazykv-bench" load --target "$worker_ADDR" --trace "$STATE/trace1.jsonl" \
  --auth-token "$STATE/client.token" | grep -E 'requests:|hit ratio|fleet compute' >&2
log "load: 40 requests with documents as text"
"$BIN/lazykv-bench" load --target "$worker_ADDR" --trace "$STATE/trace-text.jsonl" --document-text 200 \
  --auth-token "$STATE/client.token" | grep -E 'requests:' >&2

log "refused and failed calls"
gen() { "$BIN/lazykv" generate --server "$worker_ADDR" --doc "Lily had a red ball." --prompt "One day" \
  --max-tokens 8 "$@" >/dev/null 2>&1 || true; }
gen                                               # UNAUTHENTICATED
gen --auth-token "$STATE/worker.token"            # PERMISSION_DENIED
gen --auth-token "$STATE/client.token" --max-tokens 100000   # INVALID_ARGUMENT

log "cache-2 refuses a client token and a missing token"
start worker_bad_role "$BIN/lazykv-worker" --listen 127.0.0.1:0 "${MODEL_ARGS[@]}" \
  --cache-servers "$CACHES" --cache-auth-token "$STATE/client.token"
"$BIN/lazykv-bench" load --target "$worker_bad_role_ADDR" --trace "$STATE/trace-small.jsonl" >/dev/null 2>&1 || true
start worker_no_token "$BIN/lazykv-worker" --listen 127.0.0.1:0 "${MODEL_ARGS[@]}" --cache-servers "$CACHES"
"$BIN/lazykv-bench" load --target "$worker_no_token_ADDR" --trace "$STATE/trace-small.jsonl" >/dev/null 2>&1 || true

log "a worker with the chunk MAC key refuses unsigned chunks"
start worker_mac "$BIN/lazykv-worker" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 "${MODEL_ARGS[@]}" \
  --cache-servers "$CACHES" --cache-auth-token "$STATE/worker.token" --chunk-mac-key-file "$STATE/mac.key"
"$BIN/lazykv-bench" load --target "$worker_mac_ADDR" --trace "$STATE/trace-small.jsonl" \
  | grep -E 'requests:|hit ratio' >&2

log "two workers load a fresh trace at once (lease waits)"
start worker2 "$BIN/lazykv-worker" --listen 127.0.0.1:0 "${MODEL_ARGS[@]}" --kv-pool 2MiB \
  --cache-servers "$CACHES" --cache-auth-token "$STATE/worker.token"
"$BIN/lazykv-bench" load --target "$worker_ADDR" --trace "$STATE/trace2.jsonl" \
  --auth-token "$STATE/client.token" >/dev/null &
load_pid=$!
"$BIN/lazykv-bench" load --target "$worker2_ADDR" --trace "$STATE/trace2.jsonl" >/dev/null
wait "$load_pid"
sleep 1.5   # the pipeline's counters and the disk write-through settle

scrape() {  # FILE URL [curl args]
  local file=$1 url=$2; shift 2
  curl -fsS "$@" "$url" >"$OUT/$file"
  log "$OUT/$file: $(grep -c '^lazykv_' "$OUT/$file") samples"
}
scrape worker.prom "http://$worker_METRICS/metrics" "${AUTH_ADMIN[@]}"
scrape worker-mac.prom "http://$worker_mac_METRICS/metrics"
scrape cache-1.prom "http://$cache1_METRICS/metrics"
scrape cache-2.prom "http://$cache2_METRICS/metrics" "${AUTH_ADMIN[@]}"
