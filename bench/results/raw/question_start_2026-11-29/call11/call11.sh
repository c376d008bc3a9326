#!/usr/bin/env bash
# Issue 25, session 22, call 11: the read-through commit (test helpers, the bench's timeline switch read once): tests.
set -uo pipefail
bundle=$(cd pc-bundle && pwd)
source "$bundle/env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
timeout 150 cuda_prefill_test > /tmp/t.log 2>&1; echo "cuda_prefill_test rc=$?: $(grep -E '^\[  (PASSED|FAILED)' /tmp/t.log | tr '\n' ' ')"
grep -E "^\[  FAILED  \]|Failure" /tmp/t.log | head -5
timeout 60 cuda_prefill_bench questions 2>&1 | grep -E "work starts made before" | head -2
