// `dsv4 serve` through the official openai npm client: chat and completions, streaming and not,
// usage, stop strings, tools, thinking, seeds, errors, the API key, the loading state, the info
// endpoints and /metrics. The model is make-tiny's random-weight one: its text is noise, so the
// checks compare the server with itself (streamed = not streamed, stop = a cut of the unstopped
// greedy text) and with what the API promises.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { client, healthStatus, metrics, modelDir, rawRequest, startServer, waitIdle } from './server_harness.mjs';

const kMaxModelLen = 1024;
const user = (content) => [{ role: 'user', content }];

describe('dsv4 serve with the openai client', () => {
  let server, openai;
  before(async () => {
    server = await startServer(['--max-model-len', String(kMaxModelLen), '--max-request-bytes', '1048576']);
    openai = client(server);
  });
  after(async () => {
    const code = await server.stop();
    assert.equal(code, 0, `server exit code ${code}\n${server.log}`);
  });

  const greedyChat = (extra = {}) => openai.chat.completions.create({
    model: 'tiny', messages: user('Hello, DeepSeek'), temperature: 0, max_tokens: 8, ...extra,
  });

  test('GET /v1/models lists the served model with root and max_model_len', async () => {
    const list = await openai.models.list();
    assert.equal(list.data.length, 1);
    assert.equal(list.data[0].id, 'tiny');
    assert.equal(list.data[0].object, 'model');
    assert.equal(list.data[0].root, modelDir);
    assert.equal(list.data[0].max_model_len, kMaxModelLen);
  });

  test('chat: a greedy completion with usage, and the same text streamed with role first and include_usage', async () => {
    const whole = await greedyChat();
    assert.match(whole.id, /^chatcmpl-/);
    assert.equal(whole.object, 'chat.completion');
    assert.equal(whole.model, 'tiny');
    const choice = whole.choices[0];
    assert.equal(choice.message.role, 'assistant');
    assert.equal(typeof choice.message.content, 'string');
    assert.equal(choice.finish_reason, 'length');
    assert.equal(whole.usage.completion_tokens, 8);
    const tokenized = await (await fetch(`${server.url}/tokenize`, {
      method: 'POST', body: JSON.stringify({ messages: user('Hello, DeepSeek') }),
    })).json();
    assert.equal(whole.usage.prompt_tokens, tokenized.count);
    assert.equal(whole.usage.total_tokens, tokenized.count + 8);

    const stream = await greedyChat({ stream: true, stream_options: { include_usage: true } });
    let content = '', chunks = 0, finish = null, usage = null, roleFirst = null;
    for await (const chunk of stream) {
      if (chunk.choices.length === 0) {
        usage = chunk.usage;
        continue;
      }
      assert.equal(chunk.usage, null, 'chunks before the last carry usage: null');
      const delta = chunk.choices[0].delta;
      if (roleFirst === null) roleFirst = delta.role === 'assistant';
      else assert.equal(delta.role, undefined, 'the role comes only with the first chunk');
      content += delta.content ?? '';
      if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
      chunks += 1;
    }
    assert.ok(roleFirst, 'the first chunk carries the role');
    assert.ok(chunks >= 2, `one chunk per step, got ${chunks}`);
    assert.equal(content, choice.message.content);
    assert.equal(finish, 'length');
    assert.deepEqual(usage, whole.usage);
  });

  test('max_completion_tokens wins over max_tokens', async () => {
    const r = await greedyChat({ max_tokens: 6, max_completion_tokens: 3 });
    assert.equal(r.usage.completion_tokens, 3);
    assert.equal(r.choices[0].finish_reason, 'length');
  });

  test('stop strings cut the output where they first occur, streamed or not, finish_reason stop', async () => {
    const long = await greedyChat({ max_tokens: 16 });
    const chars = Array.from(long.choices[0].message.content);
    assert.ok(chars.length >= 6, `need some text, got ${JSON.stringify(long.choices[0].message.content)}`);
    const stop = chars.slice(Math.floor(chars.length / 2), Math.floor(chars.length / 2) + 2).join('');
    const text = chars.join('');
    const expected = text.slice(0, text.indexOf(stop));
    const cut = await greedyChat({ max_tokens: 16, stop: [stop, '\u0000never'] });
    assert.equal(cut.choices[0].message.content, expected);
    assert.equal(cut.choices[0].finish_reason, 'stop');
    assert.ok(cut.usage.completion_tokens <= 16);
    let streamed = '', finish = null;
    for await (const chunk of await greedyChat({ max_tokens: 16, stop, stream: true })) {
      streamed += chunk.choices[0]?.delta?.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(streamed, expected);
    assert.equal(finish, 'stop');
  });

  test('the same seed gives the same sampled text; greedy ignores the seed', async () => {
    const sampled = (seed) => greedyChat({ temperature: 1, seed });
    const [a, b] = await Promise.all([sampled(42), sampled(42)]);
    assert.equal(a.choices[0].message.content, b.choices[0].message.content);
    const [g1, g2] = await Promise.all([greedyChat({ seed: 1 }), greedyChat({ seed: 2 })]);
    assert.equal(g1.choices[0].message.content, g2.choices[0].message.content);
  });

  test('thinking on via chat_template_kwargs: the output is reasoning_content, streamed as reasoning deltas', async () => {
    const kwargs = { chat_template_kwargs: { thinking: true } };
    const plain = await greedyChat();
    const thinking = await greedyChat(kwargs);
    // The generation prompt ends with <think> instead of </think>: as many tokens, another text.
    assert.equal(thinking.usage.prompt_tokens, plain.usage.prompt_tokens);
    const message = thinking.choices[0].message;
    assert.ok(message.reasoning_content.length > 0, 'reasoning_content is filled');
    assert.equal(message.content, '', 'nothing left the reasoning');
    let reasoning = '';
    for await (const chunk of await greedyChat({ ...kwargs, stream: true })) reasoning += chunk.choices[0]?.delta?.reasoning_content ?? '';
    assert.equal(reasoning, message.reasoning_content);
  });

  const tools = [{
    type: 'function',
    function: { name: 'get_weather', description: 'Weather of a city', parameters: { type: 'object', properties: { city: { type: 'string' } } } },
  }];

  test('tools go into the prompt (not with tool_choice none); required is refused; tool turns are accepted', async () => {
    const plain = await greedyChat({ max_tokens: 1 });
    const withTools = await greedyChat({ max_tokens: 1, tools, tool_choice: 'auto' });
    assert.ok(withTools.usage.prompt_tokens > plain.usage.prompt_tokens + 20, 'the tool list is in the system turn');
    const none = await greedyChat({ max_tokens: 1, tools, tool_choice: 'none' });
    assert.equal(none.usage.prompt_tokens, plain.usage.prompt_tokens);
    await assert.rejects(greedyChat({ tools, tool_choice: 'required' }), (e) => e.status === 400 && e.param === 'tool_choice');
    const turns = await openai.chat.completions.create({
      model: 'tiny', temperature: 0, max_tokens: 2, tools,
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: '', tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: '{"temperature": 21}' },
      ],
    });
    assert.equal(turns.choices[0].finish_reason, 'length');
    assert.ok(turns.usage.prompt_tokens > withTools.usage.prompt_tokens);
  });

  test('completions: text, list of texts, token ids, lists of token ids, echo; streamed text equals the whole', async () => {
    const ask = (prompt, extra = {}) => openai.completions.create({ model: 'tiny', prompt, max_tokens: 5, temperature: 0, ...extra });
    const one = await ask('The capital of France is');
    assert.equal(one.object, 'text_completion');
    assert.match(one.id, /^cmpl-/);
    assert.equal(one.choices.length, 1);
    assert.equal(one.choices[0].finish_reason, 'length');
    assert.equal(one.usage.completion_tokens, 5);
    const tokens = await (await fetch(`${server.url}/tokenize`, { method: 'POST', body: JSON.stringify({ prompt: 'The capital of France is' }) })).json();
    assert.equal(one.usage.prompt_tokens, tokens.count, 'BOS + the text');
    const byIds = await ask(tokens.tokens);
    assert.equal(byIds.choices[0].text, one.choices[0].text, 'token ids give the same completion');
    const many = await ask(['The capital of France is', 'Two plus two']);
    assert.equal(many.choices.length, 2);
    assert.deepEqual(many.choices.map((c) => c.index), [0, 1]);
    assert.equal(many.choices[0].text, one.choices[0].text);
    assert.equal(many.usage.completion_tokens, 10);
    const lists = await ask([tokens.tokens, [5, 6, 7]]);
    assert.equal(lists.choices[0].text, one.choices[0].text);
    const echoed = await ask('The capital of France is', { echo: true });
    assert.equal(echoed.choices[0].text, 'The capital of France is' + one.choices[0].text);

    const texts = ['', ''];
    let usage = null;
    const finishes = [];
    for await (const chunk of await ask(['The capital of France is', 'Two plus two'], { stream: true, stream_options: { include_usage: true } })) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        texts[c.index] += c.text;
        if (c.finish_reason) finishes.push(c.finish_reason);
      }
    }
    assert.deepEqual(texts, many.choices.map((c) => c.text));
    assert.deepEqual(finishes, ['length', 'length']);
    assert.deepEqual(usage, many.usage);
  });

  test('logprobs: chat logprobs + top_logprobs, completions logprobs N, streamed the same; greedy picks the top token', async () => {
    const chat = await greedyChat({ max_tokens: 4, logprobs: true, top_logprobs: 3 });
    const content = chat.choices[0].logprobs.content;
    assert.equal(content.length, 4, 'one entry per generated token');
    for (const t of content) {
      assert.ok(t.logprob <= 0);
      assert.equal(t.top_logprobs.length, 3);
      assert.equal(t.top_logprobs[0].logprob, t.logprob, 'greedy: the chosen token is the most likely');
      assert.deepEqual(t.top_logprobs[0].bytes, t.bytes);
      for (let k = 1; k < 3; ++k) assert.ok(t.top_logprobs[k].logprob <= t.top_logprobs[k - 1].logprob);
    }
    const streamed = [];
    for await (const chunk of await greedyChat({ max_tokens: 4, logprobs: true, top_logprobs: 3, stream: true })) {
      streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
    }
    assert.deepEqual(streamed, content);
    const plain = await greedyChat({ max_tokens: 4 });
    assert.equal(plain.choices[0].logprobs, null, 'no logprobs unless asked');

    const completion = await openai.completions.create({ model: 'tiny', prompt: 'The sky is', max_tokens: 5, temperature: 0, logprobs: 2 });
    const lp = completion.choices[0].logprobs;
    assert.equal(lp.tokens.length, 5);
    assert.equal(lp.tokens.join(''), completion.choices[0].text);
    assert.equal(lp.text_offset[0], 0);
    for (let i = 0; i < 5; ++i) {
      assert.ok(lp.token_logprobs[i] <= 0);
      assert.ok(Object.keys(lp.top_logprobs[i]).length >= 1 && Object.keys(lp.top_logprobs[i]).length <= 2);
      assert.equal(Math.max(...Object.values(lp.top_logprobs[i])), lp.token_logprobs[i]);
      if (i) assert.equal(lp.text_offset[i], lp.text_offset[i - 1] + Buffer.byteLength(lp.tokens[i - 1]));
    }
    const tokens = [];
    for await (const chunk of await openai.completions.create({ model: 'tiny', prompt: 'The sky is', max_tokens: 5, temperature: 0, logprobs: 2, stream: true })) {
      tokens.push(...(chunk.choices[0]?.logprobs?.tokens ?? []));
    }
    assert.deepEqual(tokens, lp.tokens);
  });

  test('presence, frequency and repetition penalties change greedy output deterministically', async () => {
    const penalties = { presence_penalty: -2, frequency_penalty: -2, repetition_penalty: 0.3 };
    const plain = await greedyChat({ max_tokens: 12 });
    const [a, b] = await Promise.all([greedyChat({ max_tokens: 12, ...penalties }), greedyChat({ max_tokens: 12, ...penalties })]);
    assert.equal(a.choices[0].message.content, b.choices[0].message.content);
    assert.notEqual(a.choices[0].message.content, plain.choices[0].message.content, 'repeat-favouring penalties change the text');
    await assert.rejects(greedyChat({ repetition_penalty: 0 }), (e) => e.status === 400 && e.param === 'repetition_penalty');
  });

  test('client-visible errors: unknown model 404, bad parameter 400, prompt or max_tokens past the model length 400', async () => {
    await assert.rejects(greedyChat({ model: 'nope' }), (e) => e.status === 404 && e.code === 'model_not_found');
    await assert.rejects(greedyChat({ temperature: 5 }), (e) => e.status === 400 && e.param === 'temperature' && e.type === 'invalid_request_error');
    await assert.rejects(greedyChat({ max_tokens: 10 ** 12 }), (e) => e.status === 400 && e.code === 'context_length_exceeded');
    const long = 'word '.repeat(2000);
    await assert.rejects(greedyChat({ messages: user(long) }), (e) => e.status === 400 && e.code === 'context_length_exceeded' &&
      /maximum context length is 1024 tokens/.test(e.message));
    await assert.rejects(openai.completions.create({ model: 'tiny', prompt: [999999999] }), (e) => e.status === 400 && e.param === 'prompt[0]');
  });

  test('/tokenize, /detokenize, /version, /health', async () => {
    const post = async (route, body) => (await fetch(`${server.url}${route}`, { method: 'POST', body: JSON.stringify(body) })).json();
    const t = await post('/tokenize', { prompt: 'Hello world', add_special_tokens: false, return_token_strs: true });
    assert.equal(t.count, t.tokens.length);
    assert.equal(t.max_model_len, kMaxModelLen);
    assert.equal(t.token_strs.join(''), 'Hello world');
    const d = await post('/detokenize', { tokens: t.tokens });
    assert.equal(d.prompt, 'Hello world');
    const v = await (await fetch(`${server.url}/version`)).json();
    assert.match(v.version, /^\d+\.\d+\.\d+/);
    assert.equal(await healthStatus(server), 200);
  });

  test('/metrics: vLLM names under dsv4:, counters and histograms move, the cache returns to idle', async () => {
    const before = await metrics(server);
    await greedyChat({ max_tokens: 4 });
    const { idle, metrics: m } = await waitIdle(server);
    assert.ok(idle, 'the cache is idle after the request');
    for (const name of ['dsv4:num_requests_running', 'dsv4:num_requests_waiting', 'dsv4:kv_cache_usage_perc',
      'dsv4:prompt_tokens_total', 'dsv4:generation_tokens_total', 'dsv4:time_to_first_token_seconds_count',
      'dsv4:inter_token_latency_seconds_count', 'dsv4:time_per_output_token_seconds_count', 'dsv4:e2e_request_latency_seconds_count']) {
      assert.ok(name in m, `${name} is exported`);
    }
    assert.match(m._text, /# TYPE dsv4:time_to_first_token_seconds histogram/);
    assert.match(m._text, /dsv4:request_success_total\{model_name="tiny",finished_reason="length"\} \d+/);
    assert.ok(m['dsv4:generation_tokens_total'] >= before['dsv4:generation_tokens_total'] + 4);
    assert.ok(m['dsv4:prompt_tokens_total'] > before['dsv4:prompt_tokens_total']);
    assert.equal(m['dsv4:e2e_request_latency_seconds_count'], before['dsv4:e2e_request_latency_seconds_count'] + 1);
    assert.equal(m['dsv4:inter_token_latency_seconds_count'], before['dsv4:inter_token_latency_seconds_count'] + 3);
    assert.equal(m['dsv4:kv_cache_usage_perc'], 0);
  });
});

describe('dsv4 serve with --api-key', () => {
  let server;
  before(async () => { server = await startServer(['--api-key', 'sesame', '--max-model-len', '256']); });
  after(async () => { assert.equal(await server.stop(), 0); });

  test('the /v1 routes need the key; health, metrics and the chat page do not', async () => {
    const chat = (key) => client(server, { apiKey: key }).chat.completions.create({ model: 'tiny', messages: user('hi'), max_tokens: 1 });
    await assert.rejects(chat('wrong'), (e) => e.status === 401 && e.type === 'invalid_request_error');
    const ok = await chat('sesame');
    assert.equal(ok.usage.completion_tokens, 1);
    const bare = await rawRequest(server, 'GET', '/v1/models');
    assert.equal(bare.status, 401);
    assert.equal(JSON.parse(bare.body).error.code, 'invalid_api_key');
    assert.equal(await healthStatus(server), 200);
    assert.equal((await rawRequest(server, 'GET', '/metrics')).status, 200);
    const page = await rawRequest(server, 'GET', '/');
    assert.equal(page.status, 200);
    assert.equal(page.headers['content-type'], 'text/html; charset=utf-8');
  });
});

describe('dsv4 serve --tensor-parallel-size 2', () => {
  test('the engine drives the model split over two ranks: completions stream and finish as on one', async () => {
    const server = await startServer(['--tensor-parallel-size', '2', '--max-model-len', '256']);
    try {
      const api = client(server);
      const done = await api.completions.create({ model: 'tiny', prompt: 'Hello there', max_tokens: 6, temperature: 0 });
      assert.equal(done.usage.completion_tokens, 6);
      assert.equal(done.choices[0].finish_reason, 'length');
      let chunks = 0;
      const stream = await api.chat.completions.create({ model: 'tiny', messages: user('hi'), max_tokens: 4, stream: true });
      for await (const chunk of stream) chunks += chunk.choices.length ? 1 : 0;
      assert.ok(chunks >= 1);
      await waitIdle(server);
    } finally {
      assert.equal(await server.stop(), 0);
    }
  });
});

describe('dsv4 serve while the model loads', () => {
  test('listens first: /health and the API are 503 until the model is loaded, then 200', async () => {
    const server = await startServer(['--startup-delay', '3', '--max-model-len', '256'], { healthy: false });
    try {
      const health = await rawRequest(server, 'GET', '/health');
      assert.equal(health.status, 503);
      assert.equal(JSON.parse(health.body).error.type, 'server_error');
      const models = await rawRequest(server, 'GET', '/v1/models');
      assert.equal(models.status, 503);
      assert.match(JSON.parse(models.body).error.message, /loading/);
      assert.equal((await rawRequest(server, 'GET', '/metrics')).status, 200, 'metrics answer while loading');
      const deadline = Date.now() + 60000;
      while ((await healthStatus(server)) !== 200 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
      assert.equal(await healthStatus(server), 200);
    } finally {
      assert.equal(await server.stop(), 0);
    }
  });
});
