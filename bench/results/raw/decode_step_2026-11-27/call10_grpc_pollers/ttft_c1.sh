#!/usr/bin/env bash
# served TTFT at concurrency 1 (8 cached documents), two worker builds alternated; client TTFT against the worker's own
set -uo pipefail
source pc-bundle/env.sh
out=$1; mkdir -p $out
bin=$(dirname "$(command -v lazykv-worker)")
lazykv-bench trace --docs 100 --docs-per-request 8 --zipf-s 1.1 --requests 48 --doc-lengths fixed:512 \
  --question-tokens 16 --max-tokens 16 --vocab 128000 --concurrency 1 --seed 1 --out /tmp/trace_c1.jsonl > /dev/null
for round in 1 2; do for w in lazykv-worker-base lazykv-worker; do
  (cd /tmp && timeout 200 lazykv-bench compare --worker "$bin/$w" --trace /tmp/trace_c1.jsonl --modes lazy \
    --model synthetic:llama3-8b --worker-arg --kv-pool --worker-arg 20GiB --worker-arg --no-cache-tier \
    --out-dir "$out/${w}_$round" > "$out/${w}_$round.txt" 2>&1)
  python3 - "$out/${w}_$round/compare.json" "$w $round" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))['modes'][0]['requests']
c8 = [x for x in r if x['usage']['cached_documents'] == 8]
d = sorted(x['ttft_ms'] - x['server']['ttft_ms'] for x in r)
c = sorted(x['ttft_ms'] for x in c8); s = sorted(x['server']['ttft_ms'] for x in c8)
print('%s: client-server diff p50 %.3f (min %.3f max %.3f); 8-cached TTFT p50 client %.2f server %.2f (n=%d)' % (sys.argv[2], d[len(d)//2], d[0], d[-1], c[len(c)//2], s[len(s)//2], len(c8)))
PY
done; done
