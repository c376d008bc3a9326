#!/usr/bin/env bash
# The fuzz targets (fuzz/): builds them with clang-14, libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer into build-fuzz/ (incrementally; ccache), then runs each for
# SECONDS (default 10) over a copy of its seed corpus (fuzz/corpus/<target>/, never
# written to), one after another, and prints a line per target: executions and result.
# Exits 1 if any target crashed (an invariant, a sanitizer report, a leak, a timeout or
# running out of memory); the crashing inputs are kept in build-fuzz/fuzz-artifacts/.
# Exits 0 with a message when clang-14 or libFuzzer (libclang-rt-14-dev) is absent.
#
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
# Environment: JOBS (build parallelism, default 1), LAZYKV_MODELS_DIR (the tokenizer
# fuzzers' models; default ../shared/models), FUZZ_BUILD_DIR (default build-fuzz),
# FUZZ_ARGS (more libFuzzer flags).
# Reproduce a crash: build-fuzz/bin/<target> build-fuzz/fuzz-artifacts/<target>/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
shift || true
build_dir=${FUZZ_BUILD_DIR:-build-fuzz}
jobs=${JOBS:-1}
all_targets=(chunk_codec_fuzzer chunk_wire_fuzzer llama2c_loader_fuzzer safetensors_loader_fuzzer
  request_json_fuzzer llama2c_tokenizer_fuzzer sentencepiece_tokenizer_fuzzer chat_template_fuzzer
  openai_request_fuzzer)
if [[ $# -gt 0 ]]; then targets=("$@"); else targets=("${all_targets[@]}"); fi
if ! [[ $seconds =~ ^[0-9]+$ ]] || [[ $seconds -eq 0 ]]; then
  echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...]" >&2
  exit 2
fi

if ! command -v clang-14 >/dev/null || ! command -v clang++-14 >/dev/null; then
  echo "fuzz: skipped: clang-14 is not installed (apt-get install clang-14 libclang-rt-14-dev)"
  exit 0
fi
runtime_dir=$(clang++-14 -print-resource-dir)/lib/linux
arch=$(uname -m)
for lib in fuzzer asan ubsan_standalone; do
  if [[ ! -f $runtime_dir/libclang_rt.$lib-$arch.a ]]; then
    echo "fuzz: skipped: $runtime_dir/libclang_rt.$lib-$arch.a is missing (apt-get install libclang-rt-14-dev)"
    exit 0
  fi
done

# -g puts the build directory into each object: without this, ccache would miss in every
# fresh clone.
export CCACHE_NOHASHDIR=1
log=$(mktemp)
work=$(mktemp -d)
trap 'rm -rf "$log" "$work"' EXIT
if [[ ! -f $build_dir/CMakeCache.txt ]]; then
  echo "fuzz: configuring $build_dir"
  if ! cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DLAZYKV_ENABLE_CUDA=OFF \
      -DBUILD_TESTING=OFF -DLAZYKV_FUZZ=ON -DLAZYKV_SANITIZER=address,undefined,fuzzer-no-link >"$log" 2>&1; then
    cat "$log"
    echo "fuzz: configuring $build_dir failed"
    exit 1
  fi
fi
echo "fuzz: building ${targets[*]} in $build_dir (-j$jobs)"
if ! cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}" >"$log" 2>&1; then
  grep -E 'error|Error' "$log" | head -40 || true
  tail -20 "$log"
  echo "fuzz: build failed (full log above, last lines)"
  exit 1
fi

artifacts=$build_dir/fuzz-artifacts
failed=0
# UBSan reports are fatal (libFuzzer then saves the input); leaks are reported.
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"
export ASAN_OPTIONS="detect_leaks=1:${ASAN_OPTIONS:-}"
# The targets' scratch files (the loaders write each input to a file): in memory when
# /dev/shm is there.
scratch=$(mktemp -d -p /dev/shm lazykv-fuzz.XXXXXX 2>/dev/null || mktemp -d -p "$work")
trap 'rm -rf "$log" "$work" "$scratch"' EXIT
export TMPDIR=$scratch
for t in "${targets[@]}"; do
  corpus=$work/corpus-$t
  mkdir -p "$corpus" "$artifacts/$t"
  if [[ -d fuzz/corpus/$t ]]; then cp -R "fuzz/corpus/$t/." "$corpus/"; fi
  start=$(date +%s)
  # shellcheck disable=SC2086
  if "$build_dir/bin/$t" "$corpus" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
      -print_final_stats=1 -artifact_prefix="$artifacts/$t/" ${FUZZ_ARGS:-} >"$work/$t.log" 2>&1; then
    result=ok
  else
    result="CRASH (exit $?)"
    failed=1
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$work/$t.log" | tail -1)
  if [[ -z $execs ]]; then  # crashed: no final stats; the last progress line says how far it got
    execs=$(grep -o '^#[0-9]*' "$work/$t.log" | tail -1 | tr -d '#')
  fi
  corpus_size=$(find "$corpus" -type f | wc -l)
  printf 'fuzz: %-32s %10s execs in %3d s, corpus %4d inputs: %s\n' "$t" "${execs:-?}" \
    $(( $(date +%s) - start )) "$corpus_size" "$result"
  if [[ $result != ok ]]; then
    grep -E -A40 '^==[0-9]+==ERROR|runtime error|fuzz invariant violated|ERROR: libFuzzer|Test unit written' \
      "$work/$t.log" | head -80 || tail -60 "$work/$t.log"
    cp "$work/$t.log" "$artifacts/$t/last-run.log"
    echo "fuzz: $t: full log in $artifacts/$t/last-run.log"
  fi
done
if [[ $failed -ne 0 ]]; then
  echo "fuzz: FAILED: crashing inputs in $artifacts/"
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets ran ${seconds} s each without a crash"
