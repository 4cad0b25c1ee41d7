#!/bin/sh
# bench.sh - encode throughput of tokenizer.c against the Hugging Face Rust engine (npm
# tokenizers@0.23.2) on the same strings in one run, and the tokenizer.json load time.
# By hand, not in CI. Needs node and: npm ci --prefix tests/tokenizer
#   tests/tokenizer/bench.sh [TOKENIZER.json] [REPEAT]
# Two inputs: the test corpus (mixed scripts, edge cases) and "prose": the project's Markdown
# docs and C sources (*.md, *.c) cut into ~1 KB pieces. TOKENIZER.json defaults to
# build/tokenizer.json (make build/tokenizer.json).
set -eu
cd "$(dirname "$0")"
TOK=${1:-../../build/tokenizer.json}
REPEAT=${2:-5}
CC=${CC:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
$CC -std=c11 -O2 -o "$tmp/tok_bench" tok_bench.c ../../tokenizer.c ../../json.c
gzip -dc golden/corpus.jsonl.gz > "$tmp/corpus.jsonl"
cat ../../*.md ../../docs/*.md ../../*.c 2> /dev/null | node -e '
  const t = require("fs").readFileSync(0, "utf8"); const out = [];
  for (let i = 0; i < t.length; i += 1000) out.push(JSON.stringify(t.slice(i, i + 1000)));
  console.log(out.join("\n"));' > "$tmp/prose.jsonl"
for input in corpus prose; do
    c=$("$tmp/tok_bench" "$TOK" "$tmp/$input.jsonl" "$REPEAT" 5)
    r=$(node bench.cjs "$TOK" "$tmp/$input.jsonl" "$REPEAT")
    r1=$(TOKENIZERS_PARALLELISM=false node bench.cjs "$TOK" "$tmp/$input.jsonl" "$REPEAT")
    # shellcheck disable=SC2016
    node -e '
      const [name, c, r, r1] = process.argv.slice(1); const C = JSON.parse(c), R = JSON.parse(r), R1 = JSON.parse(r1);
      const mb = (b, s) => (b / s / 1e6).toFixed(1);
      if (C.tokens !== R.seq.tokens || C.tokens !== R.batch.tokens) console.log("WARNING: token counts differ", C.tokens, R.seq.tokens, R.batch.tokens);
      console.log(`${name}: ${C.strings} strings, ${(C.bytes / 1e6).toFixed(2)} MB, ${C.tokens} tokens`);
      console.log(`  C (1 thread)                 ${mb(C.bytes, C.s)} MB/s  ${(C.tokens / C.s / 1e6).toFixed(2)} M tokens/s`);
      console.log(`  Rust encode per string       ${mb(C.bytes, R.seq.s)} MB/s   ratio C/Rust ${(R.seq.s / C.s).toFixed(1)}x`);
      console.log(`  Rust encodeBatch, 1 thread   ${mb(C.bytes, R1.batch.s)} MB/s   ratio C/Rust ${(R1.batch.s / C.s).toFixed(1)}x`);
      console.log(`  Rust encodeBatch, threads    ${mb(C.bytes, R.batch.s)} MB/s   ratio C/Rust ${(R.batch.s / C.s).toFixed(1)}x`);
      console.log(`  load: C best ${C.load_best_s.toFixed(3)} s wall, ${C.load_cpu_best_s.toFixed(3)} s CPU (mean of 5: ${C.load_mean_s.toFixed(3)} s wall), Rust ${R.load_s.toFixed(3)} s wall`);
    ' "$input" "$c" "$r" "$r1"
done
