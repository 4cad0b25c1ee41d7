// make_corpus.mjs - writes the test strings (one JSON string per line) to stdout.
// Deterministic (seeded PRNG). Four parts:
//   A. hand-written edge cases: every branch of the split regex, the cases of TOKENIZER.md §4.6,
//      contractions in both cases (and U+017F), CR/LF mixes, all 25 white-space characters,
//      CJK, emoji/ZWJ/flags, combining marks, scripts with marks, digits of many scripts,
//      added tokens inside text (GLM's and Llama-3's), partial tags, long runs;
//   B. Unicode class boundaries: every first/last code point of every L, N, s and M range of
//      tools/unicode/ and its neighbours, each in a context that tells the classes apart;
//   C. random mixtures of characters from the classes above (short and long);
//   D. random English-like text with numbers, contractions, code and markup.
// Usage: node make_corpus.mjs > corpus.jsonl
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const uni = path.join(here, '..', '..', 'tools', 'unicode');

let seed = 0x6c6d3552;
function rnd() {   // mulberry32
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];
const ch = (cp) => String.fromCodePoint(cp);

const out = [];
const add = (s) => { out.push(s); };

// ---------------------------------------------------------------- A. edge cases
const WS = [0x9, 0xa, 0xb, 0xc, 0xd, 0x20, 0x85, 0xa0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004,
  0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000].map(ch);
const NOT_WS = [0x200b, 0xfeff, 0x180e, 0x1c, 0x1d, 0x1e, 0x1f, 0x0].map(ch);
const GLM_ADDED = ['<|endoftext|>', '[MASK]', '[gMASK]', '[sMASK]', '<sop>', '<eop>', '<|system|>', '<|user|>',
  '<|assistant|>', '<|observation|>', '<|begin_of_image|>', '<|end_of_image|>', '<|begin_of_video|>',
  '<|end_of_video|>', '<|begin_of_audio|>', '<|end_of_audio|>', '<|begin_of_transcription|>',
  '<|end_of_transcription|>', '<|code_prefix|>', '<|code_middle|>', '<|code_suffix|>', '<think>', '</think>',
  '<tool_call>', '</tool_call>', '<tool_response>', '</tool_response>', '<arg_key>', '</arg_key>', '<arg_value>',
  '</arg_value>', '/nothink', '<|begin_of_box|>', '<|end_of_box|>', '<|image|>', '<|video|>'];
const LLAMA_ADDED = ['<|begin_of_text|>', '<|end_of_text|>', '<|start_header_id|>', '<|end_header_id|>',
  '<|eot_id|>', '<|eom_id|>', '<|python_tag|>', '<|reserved_special_token_0|>', '<|reserved_special_token_10|>',
  '<|reserved_special_token_100|>', '<|finetune_right_pad_id|>'];
const PARTIAL = ['<|user', '|user|>', '<|', '|>', '<think', 'think>', '</think', '[gMASK', 'gMASK]', '<sop',
  '<|<|user|>|>', '<<think>>', '<|reserved_special_token_', '<|eot_id'];

const known = JSON.parse(fs.readFileSync(path.join(here, 'known-answers.json'), 'utf8'));
for (const [text] of known) add(text);
[
  'Hello   world  ', 'a\r\nb', 'a \r\n\t b', '  x', "don't I'M 'super", "x'ſx", "'ſ", "'ſſ", 'ſ', "x'ſ",
  '1234567', '٣٤٥٦', 'café cafe\u0301', 'नमस्ते', '你好，世界', '👨‍👩‍👧', '$x _y @@z', '\u00a0x \u3000y',
  'a.\n\nb', '🇺🇸', 'Hello world', ' Hello world', '12', '1234', '3.14159', '你好，世界！', '😀', "I'm",
  '\n\n\n', 'x<|user|>y', 'x  <|user|>y', 'x  y', ' <|endoftext|> ', 'rock\'n\'roll', "'LLama", "'super",
  ' \'super', 'x\t!', 'What is 2+2?', '', ' ', '  ', '\t', '\n', '\r', '\r\n', '\n\r', ' \n', '\n ', ' \n ',
  '\t\n\t', 'a\n\n\n b', 'a \n\n \n x', 'a  \n', '. \n', '!!!\n\n', '!!! \n', 'x \r\r\n\n y', '\u2028x',
  '\u0085x', 'x\u0085', '\u3000\u3000x', '\u00a0\u00a0\u00a0', 'a\u00a0\u00a01', ' 1', '  1', '\t1', '\u00a01',
  "'", "''", "'''s", "''s", "'s'", "'s's", "'d", "'D", "'m", "'M", "'t", "'T", "'s", "'S", "'re", "'RE", "'Re",
  "'rE", "'ve", "'VE", "'Ve", "'vE", "'ll", "'LL", "'Ll", "'lL", "'r", "'v", "'l", "'rx", "'vx", "'lx", "'r ",
  "'ll'll'll", "'sss", "'Ss", "he's", "HE'S", "we're", "WE'RE", "they've", "THEY'VE", "I'd", "I'D", "we'll",
  "WE'LL", "can't", "CAN'T", "I'm", "I'M", "’s", "it’s", "'1", "' s", "'\ns", "'ſt", "'ſ'ſ", "x'ﬆ", "'ß",
  "'K", "'\u212a", "'ǅ", "'İ", "'\u0301s", "'e", "'E",
  'Ⅳ Ⅻ ①②③ ² ³ ¹ ½ ¾', '١٢٣٤٥٦٧', '०१२३४५', '๑๒๓', '１２３４', '𝟎𝟏𝟐𝟑', '12a34', 'a1b2c3', '1,234,567.89',
  '-12', '+3', '1e10', '0x1F', 'v1.2.3', '2024-01-01T12:00:00Z', '৳100', '$100', '€99', '¥1000',
  'e\u0301\u0302\u0303', '\u0301\u0301\u0301', 'a\u0301b', ' \u0301', '\u0301a', 'x \u0301a', 'x \u0301 a',
  'ไทย ภาษา', 'สวัสดีครับ', 'עברית', 'العربية', 'مرحبا بالعالم', 'Ελληνικά', 'Русский язык', '日本語のテキスト',
  'カタカナ', 'ひらがな', '한국어 텍스트', '안녕하세요', '中文，标点。测试！', '「引用」', '汉字１２３', '𠀀𠀁𠀂',
  'ⓐⓑⓒ', '🙂🙃', '👍🏽', '👩🏻‍💻', '❤️', '☺︎', '🏳️‍🌈', '🇩🇪🇫🇷', '#️⃣', 'a👍b', ' 👍', '👍 ', '👍\n',
  '\u200b', 'a\u200bb', '\ufeffa', 'a\ufeff', '\u180ex', '\x1cx', 'a\x1f b', '\x00', 'a\x00b', '\x7f', '\x01\x02',
  '\ud7ff', '\ue000', '\uffff', '\u{10ffff}', '\u{e0001}', '\u{1f9ff}', '\u0378', '\u088f', '\u1c89', '\u{2ebf0}',
  'function foo(x) { return x * 2; }', 'if (a && b) {\n\treturn;\n}\n', '#include <stdio.h>\nint main(void) {}',
  '<div class="x">hi</div>', '{"a": [1, 2, 3], "b": null}', 'SELECT * FROM t WHERE id = 42;', '   indented',
  'x = y  # comment', '//', '/* c */', '==>', '!==', '...', '—', '–', '…', '\\', '\\n', '"', '""', '`code`',
  'https://example.com/a?b=c&d=e', 'user@example.com', 'C:\\path\\to\\file.txt', '~/dir/file', 'a_b_c', '__init__',
  'CamelCaseWord', 'snake_case_word', 'UPPER CASE', 'MiXeD cAsE', 'iPhone', 'eBay',
].forEach(add);
for (const w of WS) {
  for (const ctx of ['x' + w + 'y', w + 'x', 'x' + w, w + w + 'x', 'x' + w + w + 'y', w + '1', w + '!', '!' + w + '!',
    w + '\n', '\n' + w, w + w + w, 'a' + w + '\r\n' + w + 'b'])
    add(ctx);
}
for (const w of NOT_WS) add('x' + w + 'y ' + w + w + ' ' + w + 'a');
for (const a of GLM_ADDED.concat(LLAMA_ADDED)) {
  add(a);
  add('x' + a + 'y');
  add(' ' + a + ' ');
  add('Hello' + a + a + 'world');
  add('x  ' + a + '  y');
  add('\n' + a + '\n');
}
for (const p of PARTIAL) { add(p); add('x' + p + 'y'); add(p + '<|user|>' + p); }
add(GLM_ADDED.join(''));
add(GLM_ADDED.join(' '));
add(LLAMA_ADDED.join('\n'));
add('[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>Hello<|assistant|><think>');
add('[gMASK]<sop><|user|>weather?<|assistant|><think>need weather</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>SF</arg_value></tool_call><|observation|><tool_response>sunny</tool_response><|assistant|><think>');
// long runs (parity on big pieces; speed is tested separately)
for (const [c, n] of [[' ', 5000], ['a', 5000], ['1', 5000], ['你', 3000], ['\n', 3000], ['!', 5000], ['\t', 2000],
  ['ab', 2500], [' a', 2000], ['\u3000', 2000], ['é', 2000], ['\u0301', 2000], ['😀', 1000], ["'s", 1000], ['\r\n', 1500]]) {
  add(c.repeat(n));
  add('x' + c.repeat(n) + 'y');
}
add(' '.repeat(20000) + 'x');
for (let n = 1; n <= 40; n++) { add(' '.repeat(n) + 'x'); add('1'.repeat(n)); add('x' + '\n'.repeat(n) + 'y'); }

// ---------------------------------------------------------------- B. class boundaries
const boundary = new Set();
for (const cls of ['L', 'N', 's', 'M']) {
  for (const line of fs.readFileSync(path.join(uni, `classes-rust-${cls}.txt`), 'utf8').split('\n')) {
    if (!line.trim()) continue;
    const [lo, hi = lo] = line.trim().split('..').map((h) => parseInt(h, 16));
    for (const c of [lo - 1, lo, hi, hi + 1]) boundary.add(c);
  }
}
const okcp = (c) => c > 0 && c <= 0x10ffff && !(c >= 0xd800 && c <= 0xdfff);
for (const c of [...boundary].filter(okcp).sort((a, b) => a - b)) {
  const x = ch(c);
  // distinguishes letter / number / white space / other for x
  add(' ' + x + 'a ' + x + x + '1 ' + x + '! a' + x + '\n');
}

// ---------------------------------------------------------------- C. random mixtures
const ranges = (name) => fs.readFileSync(path.join(uni, `classes-rust-${name}.txt`), 'utf8').split('\n')
  .filter((l) => l.trim()).map((l) => { const [lo, hi = lo] = l.trim().split('..').map((h) => parseInt(h, 16)); return [lo, hi]; });
const fromRanges = (rs) => { const [lo, hi] = pick(rs); return ch(lo + ri(hi - lo + 1)); };
const L = ranges('L'), N = ranges('N'), M = ranges('M');
const pools = [
  [20, () => pick('abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ')],
  [8, () => pick('0123456789')],
  [10, () => ' '],
  [6, () => pick('.,;:!?-_()[]{}<>/\\|@#$%^&*+=~`"')],
  [5, () => "'"],
  [3, () => pick(['s', 'S', 't', 'T', 're', 'RE', 've', 'Ve', 'm', 'M', 'll', 'LL', 'lL', 'd', 'D', 'ſ'])],
  [4, () => pick(['\n', '\r', '\r\n', '\t', '\n\n'])],
  [3, () => pick(WS)],
  [1, () => pick(NOT_WS)],
  [6, () => ch(0x4e00 + ri(0x5200))],
  [2, () => ch(0x3040 + ri(0x60))],
  [2, () => ch(0xac00 + ri(0x2ba4))],
  [2, () => ch(0x0400 + ri(0x100))],
  [2, () => ch(0x0900 + ri(0x80))],
  [2, () => ch(0x0600 + ri(0x100))],
  [2, () => ch(0x0e00 + ri(0x80))],
  [4, () => fromRanges(L)],
  [3, () => fromRanges(N)],
  [4, () => fromRanges(M)],
  [4, () => pick(['😀', '👍', '🏽', '\u200d', '\ufe0f', '🇺', '🇸', '❤', '👨‍👩‍👧', '🙂', '🔥', '✅', '⭐'])],
  [3, () => { let c; do { c = ri(0x110000); } while (c >= 0xd800 && c <= 0xdfff); return ch(c); }],
  [2, () => ch(0x80 + ri(0x780))],
  [2, () => pick(GLM_ADDED)],
  [1, () => pick(LLAMA_ADDED)],
  [1, () => pick(PARTIAL)],
  [1, () => pick([' ', 'a', '1', '\n', '!', '你', '\u0301']).repeat(2 + ri(60))],
];
const total = pools.reduce((s, p) => s + p[0], 0);
const randChar = () => { let r = ri(total); for (const [w, f] of pools) { if (r < w) return f(); r -= w; } return 'x'; };
for (let i = 0; i < 2600; i++) {
  const n = i < 2200 ? 1 + ri(24) : 24 + ri(100);
  let s = '';
  for (let k = 0; k < n; k++) s += randChar();
  add(s);
}

// ---------------------------------------------------------------- D. English-like text
const WORDS = ('the of and to in is you that it he was for on are as with his they I at be this have from or one had ' +
  'by word but not what all were we when your can said there use an each which she do how their if will up other ' +
  'about out many then them these so some her would make like him into time has look two more write go see number ' +
  'no way could people my than first water been call who oil its now find long down day did get come made may part ' +
  "don't isn't I'm you're they've we'll she'd It's WON'T Hello World GLM tokenizer Transformer attention").split(' ');
const PUNCT = ['.', ',', '!', '?', ':', ';', ' -', ' (', ')', '"', "'", '...', '\n', '\n\n', ' —', '  '];
for (let i = 0; i < 700; i++) {
  let s = '';
  const n = 3 + ri(40);
  for (let k = 0; k < n; k++) {
    const r = rnd();
    if (r < 0.06) s += ' ' + ri(100000);
    else if (r < 0.08) s += ' ' + (rnd() * 1000).toFixed(ri(4));
    else if (r < 0.2) s += pick(PUNCT);
    else { let w = pick(WORDS); if (rnd() < 0.15) w = w[0].toUpperCase() + w.slice(1); if (rnd() < 0.03) w = w.toUpperCase(); s += (k && rnd() < 0.9 ? ' ' : '') + w; }
  }
  add(s);
}

process.stdout.write(out.map((s) => JSON.stringify(s)).join('\n') + '\n');
process.stderr.write(`${out.length} strings\n`);
