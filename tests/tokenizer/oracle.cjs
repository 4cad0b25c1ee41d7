// oracle.cjs - the reference: Hugging Face's Rust tokenizers (npm tokenizers@0.23.2).
//   node oracle.cjs encode TOKENIZER.json < strings.jsonl > ids.jsonl   (one JSON array of ids per line)
//   node oracle.cjs decode TOKENIZER.json < ids.jsonl > texts.jsonl     (one JSON string per line)
//   node oracle.cjs split TOKENIZER.json < strings.jsonl > ends.jsonl   (pre-tokens: byte offsets where
//        each piece ends; null for strings that contain an added token, which HF's pre-tokenizer
//        alone does not split out)
// Encoding adds no special tokens; decoding keeps special tokens (like tokenizer_decode(..., 0)).
const fs = require('fs');
const { Tokenizer } = require('tokenizers');
const [mode, tokPath] = process.argv.slice(2);
const tok = Tokenizer.fromFile(tokPath);
const lines = fs.readFileSync(0, 'utf8').split('\n');
if (lines[lines.length - 1] === '') lines.pop();
const added = mode === 'split' ? JSON.parse(fs.readFileSync(tokPath, 'utf8')).added_tokens.map((a) => a.content) : [];
(async () => {
  const out = [];
  for (const line of lines) {
    const v = JSON.parse(line);
    if (mode === 'encode') {
      const enc = await tok.encode(v, null, { addSpecialTokens: false });
      out.push(JSON.stringify(Array.from(enc.getIds())));
    } else if (mode === 'decode') {
      out.push(JSON.stringify(v.length ? await tok.decode(v, false) : ''));
    } else if (mode === 'split') {
      if (added.some((a) => v.includes(a))) { out.push('null'); continue; }
      const cps = Array.from(v), byteAt = [0];   // code point index -> byte offset
      for (const c of cps) byteAt.push(byteAt[byteAt.length - 1] + Buffer.byteLength(c));
      const pieces = tok.getPreTokenizer().preTokenizeString(v);
      out.push(JSON.stringify(pieces.map(([, [, end]]) => byteAt[end])));
    } else {
      throw new Error('mode must be encode, decode or split');
    }
  }
  process.stdout.write(out.join('\n') + (out.length ? '\n' : ''));
})();
