// bench.cjs - the Rust engine's side of bench.sh: load time and encode throughput.
//   node bench.cjs TOKENIZER.json strings.jsonl REPEAT
// Prints one JSON object: load_s, and for each mode seconds, strings, bytes, tokens.
//   seq:   await tok.encode(s) for each string in turn (one call per string)
//   batch: await tok.encodeBatch(all strings) (Rust does the whole list in one call; it uses
//          several threads unless TOKENIZERS_PARALLELISM=false)
const fs = require('fs');
const { Tokenizer } = require('tokenizers');
const [tokPath, inPath, repeatArg] = process.argv.slice(2);
const repeat = Number(repeatArg || 3);
const strings = fs.readFileSync(inPath, 'utf8').split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
const bytes = strings.reduce((s, x) => s + Buffer.byteLength(x), 0);
(async () => {
  let t0 = process.hrtime.bigint();
  const tok = Tokenizer.fromFile(tokPath);
  const load_s = Number(process.hrtime.bigint() - t0) / 1e9;
  const opt = { addSpecialTokens: false };
  for (const s of strings.slice(0, 200)) await tok.encode(s, null, opt);   // warm up
  let tokens = 0;
  t0 = process.hrtime.bigint();
  for (let r = 0; r < repeat; r++)
    for (const s of strings) tokens += (await tok.encode(s, null, opt)).getIds().length;
  const seq_s = Number(process.hrtime.bigint() - t0) / 1e9;
  let btokens = 0;
  t0 = process.hrtime.bigint();
  for (let r = 0; r < repeat; r++)
    for (const e of await tok.encodeBatch(strings, opt)) btokens += e.getIds().length;
  const batch_s = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(JSON.stringify({ load_s, strings: strings.length * repeat, bytes: bytes * repeat,
    seq: { s: seq_s, tokens }, batch: { s: batch_s, tokens: btokens } }));
})();
