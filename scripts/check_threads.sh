#!/usr/bin/env bash
# The thread checks (`make check-threads`, run by CI after the tests):
#  1. clang-14 builds the concurrent code with -Wthread-safety as an error, so every
#     access to an ABSL_GUARDED_BY member outside its lock fails the build;
#  2. the same build is instrumented with ThreadSanitizer and runs the concurrent tests
#     (cache store, engine batching, worker server, cache cluster: their server
#     processes are instrumented too); any TSAN report from any process fails.
# Usage: scripts/check_threads.sh [BUILD_DIR] (default build-tsan). Needs LAZYKV_MODELS_DIR
# for the model-backed tests (they skip without it).
set -euo pipefail
cd "$(dirname "$0")/.."
# -g puts the build directory into each object: without this, ccache would miss in every
# fresh clone (CI builds one).
export CCACHE_NOHASHDIR=1
build_dir=${1:-build-tsan}
jobs=${JOBS:-$(nproc)}
tests=(cache_store_test host_arena_test chunk_pipeline_test lease_keeper_test engine_tier_test embedded_chunk_tier_test remote_chunk_tier_test engine_batching_test generation_loop_test document_token_cache_test worker_server_test cache_cluster_test cache_server_security_test openai_server_test shm_lease_table_test shm_arena_mapping_test shm_transport_test fifo_gate_test gpu_tier_test cache_server_gpu_tier_test peer_link_test staging_pool_test cache_server_peer_link_test)

if [[ ! -f $build_dir/CMakeCache.txt ]]; then
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    -DLAZYKV_ENABLE_CUDA=OFF -DLAZYKV_SANITIZER=thread -DLAZYKV_THREAD_SAFETY_ERRORS=ON >/dev/null
fi
# The tests, the server binaries they start, and every other library that owns a lock.
cmake --build "$build_dir" -j "$jobs" --target "${tests[@]}" lazykv_bench_load

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# Debian's gRPC, protobuf and Abseil are not instrumented: what they do inside, with
# synchronization TSAN cannot see, is left out (ignore_noninstrumented_modules); every
# access made by the project's own code is checked. Where the project hands memory to
# gRPC, it states the ordering itself (common/chunk_wire.cc, SliceOwner).
export LAZYKV_TEST_SLOWDOWN=${LAZYKV_TEST_SLOWDOWN:-10}  # TSAN runs 5-15x slower (tests/test_util.h)
export TSAN_OPTIONS="log_path=$logs/tsan ignore_noninstrumented_modules=1 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan.supp ${TSAN_OPTIONS:-}"
failed=0
passed_cases=0
failed_cases=0
for t in "${tests[@]}"; do
  start=$(date +%s)
  if ! "$build_dir/bin/$t" --gtest_brief=1 >"$logs/$t.out" 2>&1; then
    echo "check-threads: $t failed"; cat "$logs/$t.out"; failed=1
  fi
  passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\?\..*/\1/p' "$logs/$t.out")
  failed_here=$(grep -c '^\[  FAILED  \] [A-Za-z]' "$logs/$t.out" || true)
  passed_cases=$((passed_cases + ${passed:-0}))
  failed_cases=$((failed_cases + failed_here))
  echo "check-threads: $t ($(( $(date +%s) - start )) s): ${passed:-0} passed, $failed_here failed"
done
reports=$(find "$logs" -name 'tsan.[0-9]*' | sort)
if [[ -n $reports ]]; then
  echo "check-threads: ThreadSanitizer reports:"
  for r in $reports; do cat "$r"; done
  failed=1
fi
echo "check-threads: clang -Wthread-safety clean; ThreadSanitizer reports: $(echo "$reports" | grep -c . || true)"
if [[ $failed -ne 0 && $failed_cases -eq 0 ]]; then failed_cases=1; fi
echo "check-threads: $passed_cases passed, $failed_cases failed"
if [[ $failed -ne 0 ]]; then exit 1; fi
