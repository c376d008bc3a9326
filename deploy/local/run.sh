#!/usr/bin/env bash
# A local LazyKV fleet with monitoring, on 127.0.0.1:
#   two lazykv-cache-server, one lazykv-worker using both (--cache-servers),
#   Prometheus (Debian's binary) scraping them with deploy/prometheus/rules loaded,
#   Grafana with deploy/grafana provisioned, if a grafana-server binary is on PATH,
# then a load of a few minutes through lazykv-bench (phases: a Zipf corpus, a new corpus,
# a burst past what the worker sustains, the first corpus again).
#
#   deploy/local/run.sh [--secure] [--duration S] [--then CMD]
#
#   --secure      TLS with mutual TLS and bearer tokens everywhere (scripts/make_dev_certs.sh):
#                 Prometheus scrapes over HTTPS with the admin token and a client certificate,
#                 the form of the commented example in deploy/prometheus/prometheus.yml; a few
#                 calls with no token or the wrong role are made so refusals show.
#   --duration S  seconds of load (default 180)
#   --then CMD    after the load, run CMD (with PROMETHEUS_URL set) and stop everything,
#                 e.g. --then "/usr/bin/python3 deploy/local/render_panels.py"
# Without --then the fleet keeps running after the load until Ctrl-C.
#
# Ports (environment overrides): worker gRPC 50051, worker metrics 9400, cache servers gRPC
# 7071/7072 and metrics 9401/9402 (as in deploy/prometheus/prometheus.yml), Prometheus 9090,
# Grafana 3000. State (logs, RocksDB, TSDB, certificates): $LAZYKV_LOCAL_DIR
# (default /tmp/lazykv-local), emptied at start.
#
# Needs: build/bin (make), Debian's prometheus package (apt-get install --no-install-recommends
# prometheus), curl, openssl with --secure. Grafana is not packaged by Debian; without it
# the script prints how to look at the dashboards with docker (deploy/local/docker-compose.yml).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
STATE=${LAZYKV_LOCAL_DIR:-/tmp/lazykv-local}
PIDS=()
# shellcheck source=deploy/local/lib.sh
source "$ROOT/deploy/local/lib.sh"

SECURE=0 DURATION=180 THEN=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --secure) SECURE=1 ;;
    --duration) DURATION=$2; shift ;;
    --then) THEN=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done

WORKER_PORT=${WORKER_PORT:-50051} WORKER_METRICS_PORT=${WORKER_METRICS_PORT:-9400}
CACHE1_PORT=${CACHE1_PORT:-7071} CACHE1_METRICS_PORT=${CACHE1_METRICS_PORT:-9401}
CACHE2_PORT=${CACHE2_PORT:-7072} CACHE2_METRICS_PORT=${CACHE2_METRICS_PORT:-9402}
PROM_PORT=${PROM_PORT:-9090} GRAFANA_PORT=${GRAFANA_PORT:-3000}
H=127.0.0.1

for tool in prometheus curl; do
  command -v $tool >/dev/null || { log "$tool not found (apt-get install --no-install-recommends $tool)"; exit 2; }
done
[[ -x $BIN/lazykv-worker ]] || { log "no $BIN/lazykv-worker: build first (make)"; exit 2; }

rm -rf "$STATE"
mkdir -p "$STATE"
trap 'log "stopping"; stop_all' EXIT
trap 'exit 130' INT TERM
model_args

# ------------------------------------------------------------------ security (optional)
SERVER_SEC=() WORKER_CACHE_SEC=() CLIENT_SEC=() SCHEME=http CURL_SEC=()
if [[ $SECURE == 1 ]]; then
  C=$STATE/certs
  "$ROOT/scripts/make_dev_certs.sh" "$C" >/dev/null
  SERVER_SEC=(--tls-cert "$C/server.pem" --tls-key "$C/server.key" --tls-client-ca "$C/ca.pem"
              --auth-tokens "$C/tokens")
  WORKER_CACHE_SEC=(--cache-tls-ca "$C/ca.pem" --cache-tls-cert "$C/client.pem" --cache-tls-key "$C/client.key"
                    --cache-auth-token "$C/worker.token")
  CLIENT_SEC=(--tls-ca "$C/ca.pem" --tls-cert "$C/client.pem" --tls-key "$C/client.key"
              --auth-token "$C/client.token")
  SCHEME=https
  CURL_SEC=(--cacert "$C/ca.pem" --cert "$C/client.pem" --key "$C/client.key"
            -H "Authorization: Bearer $(cat "$C/admin.token")")
fi

# ------------------------------------------------------------------ LazyKV
start cache1 "$BIN/lazykv-cache-server" --listen "$H:$CACHE1_PORT" --metrics-listen "$H:$CACHE1_METRICS_PORT" \
  --data-dir "$STATE/cache1" --host-capacity 2MiB --disk-capacity 8MiB "${SERVER_SEC[@]}"
start cache2 "$BIN/lazykv-cache-server" --listen "$H:$CACHE2_PORT" --metrics-listen "$H:$CACHE2_METRICS_PORT" \
  --data-dir "$STATE/cache2" --host-capacity 2MiB --disk-capacity 8MiB "${SERVER_SEC[@]}"
# A small KV pool (about 100 blocks of 16 tokens for stories260K) so chunks leave it and
# come back from the cache servers, and the burst has to queue.
start worker "$BIN/lazykv-worker" --listen "$H:$WORKER_PORT" --metrics-listen "$H:$WORKER_METRICS_PORT" \
  "${MODEL_ARGS[@]}" --kv-pool 2MiB --cache-servers "$H:$CACHE1_PORT,$H:$CACHE2_PORT" \
  --idle-spin-us 200 "${SERVER_SEC[@]}" "${WORKER_CACHE_SEC[@]}"

# ------------------------------------------------------------------ Prometheus
PROM_CFG=$STATE/prometheus.yml
{
  cat <<EOF
# Written by deploy/local/run.sh (the form of deploy/prometheus/prometheus.yml, 5 s scrapes).
global:
  scrape_interval: 5s
  evaluation_interval: 5s
rule_files:
  - $ROOT/deploy/prometheus/rules/*.yml
scrape_configs:
EOF
  for job in "lazykv-worker $H:$WORKER_METRICS_PORT" \
             "lazykv-cache-server $H:$CACHE1_METRICS_PORT\", \"$H:$CACHE2_METRICS_PORT"; do
    echo "  - job_name: ${job%% *}"
    if [[ $SECURE == 1 ]]; then
      cat <<EOF
    scheme: https
    authorization:
      type: Bearer
      credentials_file: $C/admin.token
    tls_config:
      ca_file: $C/ca.pem
      cert_file: $C/client.pem
      key_file: $C/client.key
EOF
    fi
    echo "    static_configs:"
    echo "      - targets: [\"${job#* }\"]"
  done
} >"$PROM_CFG"
promtool check config "$PROM_CFG" >/dev/null 2>&1 || { promtool check config "$PROM_CFG"; exit 1; }
prometheus --config.file="$PROM_CFG" --storage.tsdb.path="$STATE/prometheus" \
  --web.listen-address="$H:$PROM_PORT" >"$STATE/prometheus.log" 2>&1 &
PIDS+=($!)
PROMETHEUS_URL="http://$H:$PROM_PORT"
export PROMETHEUS_URL
for _ in $(seq 1 100); do curl -fs "$PROMETHEUS_URL/-/ready" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fs "$PROMETHEUS_URL/-/ready" >/dev/null || { log "prometheus did not start:"; tail "$STATE/prometheus.log" >&2; exit 1; }
log "prometheus (pid ${PIDS[-1]}): $PROMETHEUS_URL"
curl -fsS "${CURL_SEC[@]}" "$SCHEME://$H:$WORKER_METRICS_PORT/metrics" >/dev/null && log "worker /metrics answers over $SCHEME"

# ------------------------------------------------------------------ Grafana (optional)
GRAFANA_BIN=$(command -v grafana-server || command -v grafana || true)
if [[ -n $GRAFANA_BIN ]]; then
  home=${GRAFANA_HOME:-}
  for d in /usr/share/grafana /usr/local/share/grafana "$(dirname "$(dirname "$(readlink -f "$GRAFANA_BIN")")")"; do
    [[ -z $home && -d $d/conf ]] && home=$d
  done
  mkdir -p "$STATE/grafana"
  cat >"$STATE/grafana/grafana.ini" <<EOF
[paths]
data = $STATE/grafana/data
logs = $STATE/grafana/logs
plugins = $STATE/grafana/plugins
provisioning = $ROOT/deploy/grafana/provisioning
[server]
http_addr = $H
http_port = $GRAFANA_PORT
[auth.anonymous]
enabled = true
org_role = Admin
[analytics]
reporting_enabled = false
check_for_updates = false
EOF
  export LAZYKV_DASHBOARDS_DIR=$ROOT/deploy/grafana/dashboards
  sub=(); [[ $(basename "$GRAFANA_BIN") == grafana ]] && sub=(server)
  "$GRAFANA_BIN" "${sub[@]}" --homepath "$home" --config "$STATE/grafana/grafana.ini" >"$STATE/grafana.log" 2>&1 &
  PIDS+=($!)
  log "grafana (pid ${PIDS[-1]}): http://$H:$GRAFANA_PORT/dashboards (folder LazyKV)"
else
  log "grafana-server not on PATH (Debian does not package it). With docker, in another shell:"
  log "  docker compose -f $ROOT/deploy/local/docker-compose.yml up grafana"
  log "  then http://127.0.0.1:$GRAFANA_PORT (host networking: Linux only), or query $PROMETHEUS_URL/graph,"
  log "  or render the panels to PNG: /usr/bin/python3 $ROOT/deploy/local/render_panels.py"
fi

# ------------------------------------------------------------------ load
trace() {  # OUT SEED RATE SECONDS DOCS
  local n
  n=$(awk -v r="$3" -v s="$4" 'BEGIN { n = int(r * s); print (n < 1 ? 1 : n) }')
  "$BIN/lazykv-bench" trace --docs "$5" --docs-per-request 4 --doc-lengths uniform:48:96 --zipf-s 1.1 \
    --requests "$n" --rate "$3" --max-tokens 24 --seed "$2" --out "$1" >/dev/null
}
phase() {  # NAME SEED RATE SECONDS DOCS [LOAD ARGS...]
  log "load: $1 ($3 requests/s for $4 s, $5 documents, seed $2) ${*:6}"
  trace "$STATE/trace-$1.jsonl" "$2" "$3" "$4" "$5"
  "$BIN/lazykv-bench" load --target "$H:$WORKER_PORT" --trace "$STATE/trace-$1.jsonl" --deadline-ms 20000 \
    "${CLIENT_SEC[@]}" "${@:6}" 2>/dev/null | grep -E '^(throughput|hit ratio|fleet compute)' | sed 's/^/    /' >&2 || true
}
fraction() { awk -v d="$DURATION" -v f="$1" 'BEGIN { printf "%d", d * f < 1 ? 1 : d * f }'; }

sleep 5  # a first scrape before the load
# A corpus of 40 documents; then a new one of 300 (more than the cache servers hold:
# misses, publications, evictions from disk); a burst past what the worker sustains
# (queueing, RESOURCE_EXHAUSTED); the first corpus again. The first corpus's documents go as
# text, as the OpenAI API sends them (the worker's document token cache), the new one's as ids.
phase warm 1 15 "$(fraction 0.35)" 40 --document-text 160
phase new-corpus 2 15 "$(fraction 0.2)" 300
if [[ $SECURE == 1 ]]; then
  log "refused calls: two misconfigured workers (a client token, no token) towards the cache servers"
  for bad in client none; do
    tok=(--cache-auth-token "$C/$bad.token"); [[ $bad == none ]] && tok=()
    start "bad_$bad" "$BIN/lazykv-worker" --listen $H:0 "${MODEL_ARGS[@]}" \
      --cache-servers "$H:$CACHE1_PORT,$H:$CACHE2_PORT" --cache-tls-ca "$C/ca.pem" \
      --cache-tls-cert "$C/client.pem" --cache-tls-key "$C/client.key" "${tok[@]}"
    addr_var="bad_${bad}_ADDR"
    trace "$STATE/trace-bad.jsonl" 3 10 3 20
    "$BIN/lazykv-bench" load --target "${!addr_var}" --trace "$STATE/trace-bad.jsonl" >/dev/null 2>&1 || true
  done
  log "refused calls: no token, the worker role"
  for _ in 1 2 3; do
    "$BIN/lazykv" generate --server "$H:$WORKER_PORT" --tls-ca "$C/ca.pem" --tls-cert "$C/client.pem" \
      --tls-key "$C/client.key" --doc "Lily had a red ball." --prompt "One day" >/dev/null 2>&1 || true
    "$BIN/lazykv" generate --server "$H:$WORKER_PORT" --tls-ca "$C/ca.pem" --tls-cert "$C/client.pem" \
      --tls-key "$C/client.key" --auth-token "$C/worker.token" --doc "Lily had a red ball." \
      --prompt "One day" >/dev/null 2>&1 || true
  done
fi
phase burst 1 90 "$(fraction 0.1)" 40 --document-text 160
phase steady 1 15 "$(fraction 0.35)" 40 --document-text 160
sleep 10  # the last scrapes and rule evaluations

log "alerts now: $(curl -fsS "$PROMETHEUS_URL/api/v1/alerts" | python3 -c '
import json, sys
alerts = json.load(sys.stdin)["data"]["alerts"]
print(", ".join("%s %s (%s)" % (a["labels"]["alertname"], a["labels"].get("instance", a["labels"].get("job", "")),
                                a["state"]) for a in alerts) or "none")')"

if [[ -n $THEN ]]; then
  log "running: $THEN"
  (cd "$ROOT" && bash -c "$THEN")
  exit 0
fi
log "load done; the fleet keeps running: Prometheus $PROMETHEUS_URL, Ctrl-C stops everything"
while true; do  # "wait" returns on a signal, a foreground sleep would not
  sleep 3600 &
  PIDS+=($!)
  wait $!
done
