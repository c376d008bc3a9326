#!/usr/bin/env bash
# The main job until the serving layer lands: the offline CLI serves a few RAG requests
# whose documents come back in shuffled orders, once per attention mode, and prints
# what each mode reused. Usage: run_demo.sh LAZYKV_BINARY MODELS_DIR
set -euo pipefail
cli=$1
models=${2:-}

if [[ -f $models/stories260K.bin && -f $models/tok512.bin ]]; then
  model_args=(--model "$models/stories260K.bin" --tokenizer "$models/tok512.bin")
else
  echo "(no ../shared/models here: using synthetic:tiny, whose text is noise)"
  model_args=(--model synthetic:tiny)
fi

requests=$(mktemp --suffix=.jsonl)
cache_root=$(mktemp -d)
trap 'rm -rf "$requests" "$cache_root"' EXIT
# Each mode starts from an empty embedded cache tier, so the table compares like with like.
export LAZYKV_CACHE_DIR
a='Lily had a big red ball. She liked to throw it high in the sky and catch it.'
b='Tom was a little dog who lived in a small house near the park with his friend Sam.'
c='One day the sun was hot, so Lily and her mom went to the beach to swim in the sea.'
cat > "$requests" <<JSON
{"docs": ["$a", "$b", "$c"], "prompt": "Once upon a time", "max_tokens": 40}
{"docs": ["$c", "$a", "$b"], "prompt": "The next day", "max_tokens": 40}
{"docs": ["$b", "$c", "$a"], "prompt": "Lily said", "max_tokens": 40}
{"docs": ["$a", "$b", "$c"], "prompt": "Tom was happy because", "max_tokens": 40}
JSON

echo "== lazy: one position-free copy of each document, reused at any position =="
LAZYKV_CACHE_DIR=$cache_root/demo "$cli" run "${model_args[@]}" --mode lazy --requests "$requests" 2>/dev/null
echo
echo "== the same four requests in every mode: document tokens reused (cached) vs computed =="
printf '%-7s %8s %9s %10s %12s\n' mode cached computed kv_copied total_ms
for mode in none prefix block lazy; do
  LAZYKV_CACHE_DIR=$cache_root/$mode "$cli" run "${model_args[@]}" --mode "$mode" --json --requests "$requests" 2>/dev/null |
    /usr/bin/python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
u = lambda k: sum(r["usage"][k] for r in rows)
print("%-7s %8d %9d %9dB %12.1f" % (sys.argv[1], u("cached_tokens"), u("computed_tokens"),
      u("kv_bytes_copied"), sum(r["timing"]["total_ms"] for r in rows)))' "$mode"
done
