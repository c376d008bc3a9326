#!/usr/bin/env bash
# Every metric every dashboard panel and Prometheus rule queries exists in real scrapes of
# the binaries just built (the classic failure: a rename leaves panels at "No data"), and
# every panel's PromQL parses (promtool). Starts cache servers and workers on loopback
# (deploy/local/capture_scrapes.sh), drives traffic, scrapes /metrics, then checks.
#   tests/deploy/dashboard_metrics_test.sh BIN_DIR
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export LAZYKV_BIN=${1:?usage: dashboard_metrics_test.sh BIN_DIR}
if ! command -v promtool >/dev/null; then
  echo "promtool missing (Debian package prometheus; scripts/setup.sh installs it)"; exit 1
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$ROOT/deploy/local/capture_scrapes.sh" "$out" 2>"$out/capture.log" || { cat "$out/capture.log"; exit 1; }
/usr/bin/python3 "$ROOT/scripts/check_dashboards.py" --scrape "$out"/*.prom
