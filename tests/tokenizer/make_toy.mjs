// make_toy.mjs - writes small tokenizer.json files into toy/ for focused tests:
//   toy/merge-order.json      BPE with ignore_merges false and "a b" merges: rank order, leftmost
//                             first among equal ranks, a whole-vocab piece that merges differently
//   toy/ignore-merges.json    the same vocabulary with ignore_merges true and ["a","b"] merges
//   toy/strings.jsonl         test strings for both
//   toy/bad-*.json            files that must be refused (HF refuses them too, or they use an
//                             option tokenizer.c does not implement)
// make_golden.sh runs this, then encodes toy/strings.jsonl with the reference engine.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const dir = path.join(path.dirname(fileURLToPath(import.meta.url)), 'toy');
fs.mkdirSync(dir, { recursive: true });
const REGEX = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function tokenizer({ vocab, merges, ignoreMerges, added = [], mergeForm = 'array', patch = (t) => t }) {
  const t = {
    version: '1.0', truncation: null, padding: null,
    added_tokens: added.map(([id, content, special]) => ({ id, content, single_word: false, lstrip: false, rstrip: false,
      normalized: false, special })),
    normalizer: null,
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: REGEX }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: ignoreMerges,
      vocab: Object.fromEntries(vocab.map((v, i) => [v, i])),
      merges: merges.map((m) => (mergeForm === 'array' ? m : m.join(' '))) },
  };
  return JSON.stringify(patch(t), null, 1);
}

// every byte (so any text encodes), then multi-byte tokens
const bytes = [];
for (let b = 0x21; b <= 0x7e; b++) bytes.push(b);
for (let b = 0xa1; b <= 0xac; b++) bytes.push(b);
for (let b = 0xae; b <= 0xff; b++) bytes.push(b);
const byteChar = {};
let extra = 0;
for (let b = 0; b < 256; b++) byteChar[b] = bytes.includes(b) ? String.fromCodePoint(b) : String.fromCodePoint(256 + extra++);
const base = bytes.map((b) => byteChar[b]).concat(Object.keys(byteChar).map(Number).filter((b) => !bytes.includes(b)).map((b) => byteChar[b]));
const words = ['aa', 'aaaa', 'bc', 'ab', 'abc', 'cd', 'bcd', 'abcd', 'Ġa', 'Ġab', 'xy', 'yx', 'xyx', 'ĠĠ', 'ĊĊ'];
const vocab = base.concat(words);
const merges = [['b', 'c'], ['a', 'a'], ['c', 'd'], ['aa', 'aa'], ['a', 'b'], ['bc', 'd'], ['ab', 'cd'], ['a', 'bc'],
  ['Ġ', 'a'], ['Ġa', 'b'], ['x', 'y'], ['y', 'x'], ['xy', 'x'], ['Ġ', 'Ġ'], ['Ċ', 'Ċ']];
const added = [[vocab.length, '<x>', true], [vocab.length + 1, '<xy>', false], [vocab.length + 2, '<x', false]];

fs.writeFileSync(path.join(dir, 'merge-order.json'), tokenizer({ vocab, merges, ignoreMerges: false, added, mergeForm: 'string' }));
fs.writeFileSync(path.join(dir, 'ignore-merges.json'), tokenizer({ vocab, merges, ignoreMerges: true, added }));
const strings = ['abc', 'abcd', 'aaa', 'aaaa', 'aaaaa', 'aaaaaaa', 'bcd', 'abcabc', ' ab', ' abc', ' a', 'xyx', 'xyxyx', 'yxy',
  'xyxy', '  ', '   x', '\n\n\n', 'a<x>b', '<xy>', '<x>y', '<xyz', '<x<xy>', '<', 'ab cd abcd', 'ca', 'é', '', 'aaaa bcd aaaaaaaa',
  'abcdabcdaaaa', 'xyxyxyxyxyx'];
fs.writeFileSync(path.join(dir, 'strings.jsonl'), strings.map((s) => JSON.stringify(s)).join('\n') + '\n');

const bad = {
  'merge-part-not-in-vocab': { merges: merges.concat([['a', 'zz']]) },
  'merge-result-not-in-vocab': { merges: merges.concat([['c', 'a']]) },
  'merge-empty-part': { merges: merges.concat([['', 'a']]), mergeForm: 'string' },
  'merge-no-space': { mergeForm: 'string', patch: (t) => { t.model.merges.push('abc'); return t; } },
  'lstrip': { patch: (t) => { t.added_tokens[0].lstrip = true; return t; } },
  'other-regex': { patch: (t) => { t.pre_tokenizer.pretokenizers[0].pattern.Regex = '\\s+'; return t; } },
  'normalizer': { patch: (t) => { t.normalizer = { type: 'NFC' }; return t; } },
  'wordpiece': { patch: (t) => { t.model.type = 'WordPiece'; return t; } },
  'byte-fallback': { patch: (t) => { t.model.byte_fallback = true; return t; } },
};
for (const [name, o] of Object.entries(bad))
  fs.writeFileSync(path.join(dir, `bad-${name}.json`), tokenizer({ vocab, merges, ignoreMerges: false, added, ...o }));
