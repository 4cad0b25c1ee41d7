// make_idlists.mjs - random id sequences for the decode test (one JSON array per line):
// byte tokens (partial UTF-8 characters), any regular id, added tokens, unknown ids.
// Usage: node make_idlists.mjs N_REGULAR N_ALL > idlists.jsonl
const [nreg, nall] = process.argv.slice(2).map(Number);
let seed = 0x1d5eed;
function rnd() {   // mulberry32
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const ri = (n) => Math.floor(rnd() * n);
const lines = [];
for (let i = 0; i < 600; i++) {
  const ids = [];
  const n = 1 + ri(16);
  for (let k = 0; k < n; k++) {
    const r = rnd();
    if (r < 0.45) ids.push(ri(256));
    else if (r < 0.85) ids.push(ri(nreg));
    else if (r < 0.95) ids.push(nreg + ri(nall - nreg));
    else ids.push(nall + ri(30));
  }
  lines.push(JSON.stringify(ids));
}
process.stdout.write(lines.join('\n') + '\n');
