# shellcheck shell=bash disable=SC2034
# Helpers shared by deploy/local/run.sh and deploy/local/capture_scrapes.sh (sourced, not run).
# Needs: ROOT (the repository), STATE (a scratch directory), PIDS (an array, may be empty).

BIN=${LAZYKV_BIN:-$ROOT/build/bin}
MODEL=${LAZYKV_MODEL:-$ROOT/../shared/models/stories260K.bin}
TOKENIZER=${LAZYKV_TOKENIZER:-$ROOT/../shared/models/tok512.bin}
if [[ ! -f $MODEL ]]; then MODEL=synthetic:tiny; TOKENIZER=; fi

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# start NAME CMD... : starts CMD in the background with its output in $STATE/NAME.log, waits
# for its "listening on HOST:PORT metrics on HOST:PORT" line and sets ${NAME}_ADDR and
# ${NAME}_METRICS (NAME must be a shell identifier). The pid goes into PIDS.
start() {
  local name=$1; shift
  : >"$STATE/$name.log"
  "$@" >>"$STATE/$name.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  echo "$pid" >"$STATE/$name.pid"
  local line="" _
  for _ in $(seq 1 200); do
    line=$(grep -m1 'listening on' "$STATE/$name.log" || true)
    [[ -n $line ]] && break
    if ! kill -0 "$pid" 2>/dev/null; then
      log "$name exited:"; cat "$STATE/$name.log" >&2; return 1
    fi
    sleep 0.05
  done
  [[ -n $line ]] || { log "$name did not start:"; cat "$STATE/$name.log" >&2; return 1; }
  local addr metrics
  addr=$(sed -E 's/.*listening on ([^ ]+).*/\1/' <<<"$line")
  metrics=$(sed -nE 's/.*metrics on ([^ ]+).*/\1/p' <<<"$line")
  printf -v "${name}_ADDR" '%s' "$addr"
  printf -v "${name}_METRICS" '%s' "$metrics"
  log "$name (pid $pid): grpc $addr, metrics ${metrics:-off}"
}

# stop_all: SIGTERM to every pid this script started (and only those), then wait for them.
stop_all() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}

model_args() {
  MODEL_ARGS=(--model "$MODEL")
  [[ -n $TOKENIZER ]] && MODEL_ARGS+=(--tokenizer "$TOKENIZER")
  return 0
}
