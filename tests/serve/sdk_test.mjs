// tests/serve/sdk_test.mjs - the official OpenAI Node SDK (package.json pins it) as a client of
// glm serve: node tests/serve/sdk_test.mjs URL KEY_URL KEY
//   URL      a server without --api-key
//   KEY_URL  a server started with --api-key KEY
// Prints one "PASS name" or "FAIL name (why)" line per check (tests/test_serve.sh counts
// them) and exits 0; a missing node_modules is one FAIL line that says to run make deps.
const [url, keyUrl, key] = process.argv.slice(2);
let OpenAI;
try {
  ({ default: OpenAI } = await import('openai'));
} catch (e) {
  console.log(`FAIL sdk_openai_package_installed (run make deps, or npm ci --prefix tests/serve: ${String(e.message).split('\n')[0]})`);
  process.exit(0);
}

const line = (good, name, why) => console.log(good ? `PASS ${name}` : `FAIL ${name} (${String(why).replace(/\n/g, ' ').slice(0, 500)})`);
async function check(name, fn) {
  try {
    const why = await fn();
    line(!why, name, why);
  } catch (e) {
    line(false, name, `${e.constructor?.name}: ${e.message}`);
  }
}

const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'x', maxRetries: 0, timeout: 120000 });
const messages = [{ role: 'user', content: 'Hello! What is 2+2?' }];

await check('sdk_models_list', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  return ids.length === 1 && typeof ids[0] === 'string' && ids[0].length ? '' : `models ${JSON.stringify(ids)}`;
});

let whole;
await check('sdk_chat_completion', async () => {
  whole = await client.chat.completions.create({ model: 'm', messages, max_tokens: 12, temperature: 0, ignore_eos: true });
  const m = whole.choices[0].message;
  if (whole.object !== 'chat.completion' || m.role !== 'assistant' || typeof m.content !== 'string') return JSON.stringify(whole);
  if (whole.usage.completion_tokens !== 12) return `usage ${JSON.stringify(whole.usage)}`;
  return '';
});

await check('sdk_chat_stream_equals_whole', async () => {
  const stream = await client.chat.completions.create({
    model: 'm', messages, max_tokens: 12, temperature: 0, ignore_eos: true, stream: true,
    stream_options: { include_usage: true },
  });
  let content = '', reasoning = '', n = 0, usage = null, finish = null;
  for await (const chunk of stream) {
    n++;
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    content += c.delta.content ?? '';
    reasoning += c.delta.reasoning_content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  const m = whole?.choices[0].message ?? {};
  if (content !== m.content || reasoning !== (m.reasoning_content ?? '')) {
    return `streamed ${JSON.stringify([reasoning, content])}, whole ${JSON.stringify([m.reasoning_content, m.content])}`;
  }
  if (!usage || usage.completion_tokens !== 12 || finish !== 'length' || n < 3) return `usage ${JSON.stringify(usage)}, finish ${finish}, ${n} chunks`;
  return '';
});

await check('sdk_chat_thinking_off', async () => {
  const r = await client.chat.completions.create({
    model: 'm', messages, max_tokens: 8, temperature: 0, ignore_eos: true,
    chat_template_kwargs: { enable_thinking: false },
  });
  const m = r.choices[0].message;
  return typeof m.content === 'string' && m.content.length && !m.reasoning_content ? '' : JSON.stringify(m);
});

await check('sdk_completion', async () => {
  const r = await client.completions.create({ model: 'm', prompt: 'Once upon a time', max_tokens: 6, temperature: 0, ignore_eos: true });
  const s = await client.completions.create({ model: 'm', prompt: 'Once upon a time', max_tokens: 6, temperature: 0, ignore_eos: true, stream: true });
  let text = '';
  for await (const chunk of s) text += chunk.choices[0]?.text ?? '';
  if (r.object !== 'text_completion' || typeof r.choices[0].text !== 'string' || r.usage.completion_tokens !== 6) return JSON.stringify(r);
  return text === r.choices[0].text ? '' : `streamed ${JSON.stringify(text)}, whole ${JSON.stringify(r.choices[0].text)}`;
});

await check('sdk_bad_request_error_400', async () => {
  try {
    await client.chat.completions.create({ model: 'm', messages, temperature: 5 });
    return 'no error for temperature 5';
  } catch (e) {
    if (!(e instanceof OpenAI.BadRequestError) || e.status !== 400) return `${e.constructor?.name} status ${e.status}: ${e.message}`;
    return e.param === 'temperature' || /temperature/.test(e.message) ? '' : `the error does not name temperature: ${e.message}`;
  }
});

await check('sdk_wrong_key_authentication_error_401', async () => {
  const bad = new OpenAI({ baseURL: keyUrl + '/v1', apiKey: 'not-' + key, maxRetries: 0 });
  try {
    await bad.models.list();
    return 'no error with a wrong key';
  } catch (e) {
    return e instanceof OpenAI.AuthenticationError && e.status === 401 ? '' : `${e.constructor?.name} status ${e.status}: ${e.message}`;
  }
});

await check('sdk_right_key', async () => {
  const good = new OpenAI({ baseURL: keyUrl + '/v1', apiKey: key, maxRetries: 0 });
  const r = await good.completions.create({ model: 'm', prompt: [1, 2, 3], max_tokens: 2, temperature: 0 });
  return r.choices.length === 1 ? '' : JSON.stringify(r);
});
