// oracle.cjs - the reference: Hugging Face's Rust tokenizers (npm tokenizers@0.23.2).
//   node oracle.cjs encode TOKENIZER.json < strings.jsonl > ids.jsonl   (one JSON array of ids per line)
//   node oracle.cjs decode TOKENIZER.json < ids.jsonl > texts.jsonl     (one JSON string per line)
// Encoding adds no special tokens; decoding keeps special tokens (like tokenizer_decode(..., 0)).
const fs = require('fs');
const { Tokenizer } = require('tokenizers');
const [mode, tokPath] = process.argv.slice(2);
const tok = Tokenizer.fromFile(tokPath);
const lines = fs.readFileSync(0, 'utf8').split('\n');
if (lines[lines.length - 1] === '') lines.pop();
(async () => {
  const out = [];
  for (const line of lines) {
    const v = JSON.parse(line);
    if (mode === 'encode') {
      const enc = await tok.encode(v, null, { addSpecialTokens: false });
      out.push(JSON.stringify(Array.from(enc.getIds())));
    } else if (mode === 'decode') {
      out.push(JSON.stringify(v.length ? await tok.decode(v, false) : ''));
    } else {
      throw new Error('mode must be encode or decode');
    }
  }
  process.stdout.write(out.join('\n') + (out.length ? '\n' : ''));
})();
