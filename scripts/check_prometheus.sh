#!/usr/bin/env bash
# Checks deploy/prometheus with promtool (Debian's prometheus package):
#   promtool check rules  deploy/prometheus/rules/*.yml
#   promtool test rules   deploy/prometheus/tests/*.yml
#   promtool check config deploy/prometheus/prometheus.yml
# plus: every recording rule and alert is named in some unit test, and the commented
# HTTPS + bearer-token scrape example in prometheus.yml, uncommented, is a valid config.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
P=$ROOT/deploy/prometheus
command -v promtool >/dev/null || {
  echo "promtool not found: apt-get install --no-install-recommends prometheus" >&2; exit 2; }
cd "$P"

echo "== promtool check rules"
promtool check rules rules/*.yml
echo "== promtool test rules"
promtool test rules tests/*.yml
echo "== promtool check config"
promtool check config prometheus.yml

echo "== every rule has a unit test"
missing=0
while read -r name; do
  if ! grep -qF -- "$name" tests/*.yml; then echo "  no test names $name"; missing=1; fi
done < <(sed -nE 's/^ *- (record|alert): *([^ ]+).*/\2/p' rules/*.yml)
[[ $missing == 0 ]] && echo "  SUCCESS: $(grep -cE '^ *- (record|alert):' rules/*.yml | awk -F: '{s+=$NF} END {print s}') rules, each in a test"

echo "== the commented HTTPS example of prometheus.yml"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/rules"
cp rules/*.yml "$tmp/rules/"
for f in admin.token ca.pem client.pem client.key; do echo x >"$tmp/$f"; done
{
  sed -n '1,/^scrape_configs:/p' prometheus.yml
  # the commented jobs, uncommented, with their file paths pointed at placeholders
  sed -n '/^  # - job_name:/,$p' prometheus.yml | sed -E 's/^  # ?/  /' |
    sed "s#/etc/lazykv/certs/#$tmp/#"
} >"$tmp/prometheus-https.yml"
promtool check config "$tmp/prometheus-https.yml" | sed "s#$tmp/##"
grep -q 'scheme: https' "$tmp/prometheus-https.yml"
[[ $missing == 0 ]]
