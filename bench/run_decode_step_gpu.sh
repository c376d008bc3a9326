#!/usr/bin/env bash
# Issue 25's batch-1 decode step on the GPU machine, in one call: the GPU tests named in TESTS
# (those not bundled skipped), then cuda_backend_bench alternated over the launch variants
# named in VARIANTS (name=ENV=VALUE,ENV=VALUE; "base" runs the defaults; BIN=PROGRAM runs another
# build of it packed in the bundle), ROUNDS times, the
# first round of each with --kernel-trace, while the call's time lasts (BUDGET_S, default
# 480 s from the start), and cuda_decode_bench's split sweep if bundled. SHOW_TTFT_TRACE=1 also
# prints the TTFT step's kernel trace; E2E_BATCHED=1 adds the trace under load per variant;
# SERVED=1 (with lazykv-worker and lazykv-bench in the bundle) adds the served trace at
# concurrency 1 per variant and round (TTFT p50 by cached documents; the variant's settings are
# the worker's environment; SKIP_BENCH=1 leaves out the cuda_backend_bench rounds; a setting WARG=--flag=value is given to the worker as a flag instead).
# Here: LAZYKV_MODELS_DIR=../shared/models bash bench/bundle_backend_gpu.sh OUT build cuda_backend_bench \
#   [cuda_decode_bench] [lazykv-worker lazykv-bench] [tests] && cp bench/run_decode_step_gpu.sh OUT/data/
# There: bash OUT/data/run_decode_step_gpu.sh OUT LOGDIR; the logs come back as LOGDIR/logs.tar.xz.
set -uo pipefail
bundle=$1; out=$2
logs=$out/logs
mkdir -p "$logs"
source "$bundle/env.sh"
export LAZYKV_MODELS_DIR=$bundle/data
export LAZYKV_CUPTI=${LAZYKV_CUPTI:-/usr/local/cuda/lib64/libcupti.so.13}
start=$SECONDS
budget=${BUDGET_S:-480}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$logs/device.txt"
status=0
# A variant (NAME or NAME=ENV=VALUE,ENV=VALUE) into `name`, `vars` (its settings as written),
# `settings` for env, and the program to run: cuda_backend_bench, or the one a BIN=PROGRAM
# setting names (an earlier build packed beside).
variant_program() {
  name=${1%%=*}; vars=; [[ $1 == *=* ]] && vars=${1#*=}
  program=cuda_backend_bench; settings=(); worker_args=()
  local setting tier=none
  for setting in ${vars//,/ }; do
    if [[ $setting == BIN=* ]]; then program=${setting#BIN=}
    elif [[ $setting == TIER=* ]]; then
      tier=${setting#TIER=}
      [[ $tier == default || $tier == none ]] || { echo "TIER=$tier: default or none" >&2; exit 2; }
    elif [[ $setting == WARG=* ]]; then worker_args+=(--worker-arg "${setting#WARG=}")
    else settings+=("$setting"); fi
  done
  [[ $tier == none ]] && worker_args=(--worker-arg --no-cache-tier "${worker_args[@]}")
}
# A test named ENV=VALUE:test runs with that variable set (its log named ENV=VALUE_test.log).
for entry in ${TESTS:-}; do
  t=${entry##*:}; vars=; [[ $entry == *:* ]] && vars=${entry%:*}
  log="$logs/${vars:+${vars}_}$t.log"
  command -v "$t" > /dev/null || { echo "$t: not in the bundle, skipped"; continue; }
  env $vars timeout 300 "$t" > "$log" 2>&1 || status=1
  echo "$entry: $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "$log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$log" | head -n 5
done
for round in $(seq 1 "${ROUNDS:-2}"); do
  [[ -n ${SKIP_BENCH:-} ]] && break  # SKIP_BENCH=1: only the tests and what E2E_BATCHED / SERVED add
  for variant in ${VARIANTS:-base}; do
    if (( SECONDS - start > budget )); then echo "time budget spent: stopping before $variant round $round"; break 2; fi
    variant_program "$variant"
    trace=; [[ $round == 1 ]] && trace=--kernel-trace
    log="$logs/${name}_$round.txt"
    env "${settings[@]}" timeout 200 "$program" $trace > "$log" 2>&1 || status=1
    echo "== $name round $round ($vars) $trace"
    grep -E "^decode step|^TTFT|^a step's GEMMs at 1 row|tensor-core skinny kernel" "$log"
    [[ -n $trace ]] && sed -n '/^kernel trace: decode/,/^per step/p' "$log" | head -n 14
    [[ -n $trace && -n ${SHOW_TTFT_TRACE:-} ]] && sed -n '/^kernel trace: the TTFT step/,/^per step/p' "$log" | head -n 22
  done
done
# E2E_BATCHED=1: the issue's trace under load (160 requests, 64 tokens out, concurrency 64,
# lazy; E2E_CONCURRENCY sets it, 16 keeps decode batches within the tensor-core skinny kernel's
# 5-16 rows) per variant, alternated, ROUNDS times: served-shaped throughput of each variant.
if [[ -n ${E2E_BATCHED:-} ]]; then
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for variant in ${VARIANTS:-base}; do
      if (( SECONDS - start > budget )); then echo "time budget spent: stopping before e2e $variant"; break 2; fi
      variant_program "$variant"
      log="$logs/e2e_${name}_$round.txt"
      env "${settings[@]}" timeout 300 "$program" --e2e-batched --modes lazy --requests 160 --max-tokens 64 \
        --max-concurrency "${E2E_CONCURRENCY:-64}" > "$log" 2>&1 || status=1
      echo "== e2e batched $name round $round ($vars)"
      grep -E "^mode|^lazy" "$log" | head -n 4
    done
  done
fi
# SERVED=1: the cached-TTFT trace served at concurrency 1 (60 requests, 24 of them with all 8
# documents cached; SERVED_CONCURRENCY and SERVED_REQUESTS change both) through
# `lazykv-worker --no-cache-tier` (a variant's TIER=default: with the worker's default tier), per
# variant, alternated, ROUNDS times. SERVED_TEXT_BYTES=N sends documents as N bytes of text each
# (lazykv-bench --document-text), tokenized by the Llama 3 tokenizer.json copied into data/.
if [[ -n ${SERVED:-} ]] && command -v lazykv-worker > /dev/null && command -v lazykv-bench > /dev/null; then
  text_args=()  # SERVED_TEXT_BYTES=N: documents sent as text (the bundle's data/tokenizer.json tokenizes them)
  [[ -n ${SERVED_TEXT_BYTES:-} ]] && text_args=(--document-text "$SERVED_TEXT_BYTES" --tokenizer "$(cd "$bundle" && pwd)/data/tokenizer.json")
  trace=/tmp/served_trace.jsonl
  lazykv-bench trace --docs 100 --docs-per-request 8 --zipf-s 1.1 --requests "${SERVED_REQUESTS:-60}" \
    --doc-lengths fixed:512 --question-tokens 16 --max-tokens 16 --vocab 128000 \
    --concurrency "${SERVED_CONCURRENCY:-1}" --seed 1 --out "$trace" > /dev/null
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for variant in ${VARIANTS:-base}; do
      if (( SECONDS - start > budget )); then echo "time budget spent: stopping before served $variant"; break 2; fi
      variant_program "$variant"  # its settings; the worker is the bundle's
      dir="$logs/served_${name}_$round"
      (cd /tmp && env "${settings[@]}" timeout 300 lazykv-bench compare --worker "$(command -v lazykv-worker)" \
        --trace "$trace" --modes lazy --model synthetic:llama3-8b --worker-arg --kv-pool --worker-arg 20GiB \
        "${text_args[@]}" "${worker_args[@]}" --out-dir "$dir" > "$dir.txt" 2>&1) || status=1
      echo "== served $name round $round ($vars)"
      grep -E "^mode|^lazy" "$dir.txt" | head -n 4
      [[ -f $bundle/data/served_transit.py && -f $dir/compare.json ]] && python3 "$bundle/data/served_transit.py" "$dir/compare.json" 8
      find "$dir" -type f ! -name compare.json ! -name 'worker-*.log' -delete 2> /dev/null
      grep -h "idle watches\|\] steps: " "$dir"/worker-*.log 2> /dev/null | sed 's/^.*\] //'
    done
  done
fi
if command -v cuda_decode_bench > /dev/null && (( SECONDS - start < budget )); then
  timeout 120 cuda_decode_bench > "$logs/cuda_decode_bench.txt" 2>&1 || status=1
  grep -E "^ *1 +[0-9]+ |^splits +[0-9]+ +1 " "$logs/cuda_decode_bench.txt" | head -n 30
fi
tar -C "$out" -cJf "$out/logs.tar.xz" logs && rm -rf "$logs"
exit $status
