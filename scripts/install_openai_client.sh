#!/usr/bin/env bash
# The official OpenAI Node.js client (npm `openai`, pinned) in .tools/openai-client, for the
# test that streams a chat completion through it (tests/openai/node_client.mjs). Debian
# packages no OpenAI client. Idempotent and quiet once installed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version=7.57.0
prefix="$root/.tools/openai-client"
stamp="$prefix/.installed"
[[ -f $stamp && $(cat "$stamp") == "$version" ]] && exit 0
mkdir -p "$prefix"
if [[ -d $root/.git/info ]] && ! grep -qxF '/.tools/' "$root/.git/info/exclude" 2>/dev/null; then
  echo '/.tools/' >>"$root/.git/info/exclude"
fi
npm install --silent --no-audit --no-fund --no-save --prefix "$prefix" "openai@$version" 2>"$prefix/npm.err" || {
  grep -v '^npm warn' "$prefix/npm.err" >&2
  echo "setup: could not install the OpenAI client (npm openai@$version)" >&2
  exit 1
}
rm -f "$prefix/npm.err"
echo "$version" >"$stamp"
