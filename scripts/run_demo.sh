#!/usr/bin/env bash
# The main job (`make run`): a skewed RAG workload (Zipf document popularity, documents
# in shuffled orders) replayed over gRPC against a real lazykv-worker, once per
# attention mode with everything else identical (a fresh worker and an empty embedded
# cache tier each), then one table side by side. The trace, the JSON results and the
# plot stay in the results folder.
# Usage: run_demo.sh BUILD_BIN_DIR MODELS_DIR [RESULTS_DIR]
set -euo pipefail
bin=$1
models=${2:-}
results=${3:-results/run-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$results"

if [[ -f $models/stories260K.bin && -f $models/tok512.bin ]]; then
  model_args=(--model "$models/stories260K.bin" --tokenizer "$models/tok512.bin")
  vocab=512
else
  echo "(no ../shared/models here: using synthetic:tiny, whose text is noise)"
  model_args=(--model synthetic:tiny)
  vocab=512
fi

# 40 documents of 48-96 tokens, 4 per request, Zipf s=1.1, 120 requests arriving as a
# Poisson process; the question and answer are short, as in RAG.
trace_args=(--docs 40 --docs-per-request 4 --zipf-s 1.1 --requests 120 --doc-lengths uniform:48:96
            --question-tokens 12 --max-tokens 16 --vocab "$vocab" --rate 40 --seed 7)
echo "trace: ${trace_args[*]}"
"$bin/lazykv-bench" trace "${trace_args[@]}" --out "$results/trace.jsonl"
"$bin/lazykv-bench" compare --worker "$bin/lazykv-worker" "${model_args[@]}" \
  --trace "$results/trace.jsonl" --modes lazy,block,prefix,none --out-dir "$results"
echo
echo "results: $results (trace.jsonl, compare.json, compare.png)"
