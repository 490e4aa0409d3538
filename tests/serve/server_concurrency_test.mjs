// Many streams at once, and streams that go away.
// - 32 concurrent streaming completions, prompts of 32 different lengths, greedy: all complete and
//   each text equals that of the same request sent alone (the CPU backend is batch-invariant, so
//   a request's tokens do not depend on what else is in its steps).
// - Dropped clients: streams aborted mid-generation, a non-streaming request whose client gives up
//   and a request still waiting for a sequence slot are cancelled in the engine, their cache pages
//   freed at once (/metrics back to idle), while the streams around them finish untouched.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { metrics, rawExchange, startServer, streamEvents, waitFor, waitIdle } from './server_harness.mjs';

const kStreams = 32;
const kTokens = 5;

// A prompt of `length` ids, different per length (ids well inside the tokenizer's vocabulary).
const promptOf = (length) => Array.from({ length }, (_, i) => 100 + ((i * 131 + length * 977) % 90000));

async function streamedText(server, body, onEvent) {
  let text = '', finish = null, chunks = 0;
  const result = await streamEvents(server, '/v1/completions', { ...body, stream: true }, (data, index) => {
    if (data === '[DONE]') return undefined;
    const chunk = JSON.parse(data);
    if (chunk.error) throw new Error(`stream error: ${data}`);
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
    chunks += 1;
    return onEvent ? onEvent(chunk, index) : undefined;
  });
  return { ...result, text, finish, chunks, done: result.events.at(-1) === '[DONE]' };
}

describe('concurrent and dropped streams', () => {
  let server;
  before(async () => {
    server = await startServer(['--max-model-len', '512', '--max-num-seqs', '32', '--max-num-batched-tokens', '1024']);
  });
  after(async () => {
    const code = await server.stop();
    assert.equal(code, 0, `server exit code ${code}\n${server.log}`);
  });

  test(`${kStreams} concurrent greedy streams equal the same requests sent alone`, async () => {
    const requests = Array.from({ length: kStreams }, (_, i) => ({
      model: 'tiny', prompt: promptOf(1 + i * 2), max_tokens: kTokens, temperature: 0, ignore_eos: true,
    }));
    const started = Date.now();
    const together = await Promise.all(requests.map((r) => streamedText(server, r)));
    const concurrentSeconds = (Date.now() - started) / 1000;
    const alone = [];
    for (const r of requests) alone.push(await streamedText(server, r));
    for (let i = 0; i < kStreams; ++i) {
      assert.ok(together[i].done && alone[i].done, `stream ${i} ended with [DONE]`);
      assert.equal(together[i].finish, 'length');
      assert.equal(together[i].text, alone[i].text, `stream ${i} (prompt of ${requests[i].prompt.length} tokens)`);
    }
    const distinct = new Set(together.map((t) => t.text)).size;
    assert.ok(distinct > kStreams / 2, `the prompts lead to different texts (${distinct} distinct)`);
    console.log(`${kStreams} concurrent streams in ${concurrentSeconds.toFixed(1)} s, all equal to their solo runs`);
    assert.ok((await waitIdle(server)).idle);
  });

  test('streams dropped mid-generation are cancelled and free their pages; the others finish', async () => {
    const base = await metrics(server);
    const long = (i) => ({ model: 'tiny', prompt: promptOf(20 + i), max_tokens: 400, temperature: 0, ignore_eos: true });
    const short = (i) => ({ model: 'tiny', prompt: promptOf(30 + i), max_tokens: 12, temperature: 0, ignore_eos: true });
    const dropped = Array.from({ length: 6 }, (_, i) => streamedText(server, long(i), (chunk, index) => (index >= 2 + i ? 'abort' : undefined)));
    const kept = Array.from({ length: 4 }, (_, i) => streamedText(server, short(i)));
    const droppedResults = await Promise.all(dropped);
    for (const r of droppedResults) assert.ok(r.aborted);
    const droppedAt = Date.now();
    const left = await waitFor(async () => (await metrics(server))['dsv4:num_requests_running'] <= 4, 3000, 10);
    const freedMs = Date.now() - droppedAt;
    assert.ok(left, 'the dropped streams left the engine');
    const keptResults = await Promise.all(kept);
    for (const [i, r] of keptResults.entries()) {
      assert.ok(r.done, `kept stream ${i} completed`);
      assert.equal(r.finish, 'length');
      assert.equal(r.text, (await streamedText(server, short(i))).text, `kept stream ${i} is undisturbed`);
    }
    const { idle, metrics: m } = await waitIdle(server, 5000);
    assert.ok(idle, `pages back to idle after the drops: ${m['dsv4:kv_cache_pages_in_use']} in use`);
    console.log(`dropped streams left the engine within ${freedMs} ms of the last drop`);
    assert.equal(m['dsv4:request_success_total{model_name="tiny",finished_reason="abort"}'] -
      base['dsv4:request_success_total{model_name="tiny",finished_reason="abort"}'], 6);
    assert.ok(m['dsv4:generation_tokens_total'] - base['dsv4:generation_tokens_total'] < 6 * 400, 'the dropped streams stopped generating');
  });

  test('a request still queued, whose client leaves, is cancelled and leaves the queue', async () => {
    const base = await metrics(server);
    const gauge = async (name) => (await metrics(server))[name];
    // 32 long streams fill every sequence slot, so one more request waits in the queue.
    let release = false;
    const blockers = Array.from({ length: 32 }, (_, i) => streamedText(server,
      { model: 'tiny', prompt: promptOf(5 + i), max_tokens: 400, temperature: 0, ignore_eos: true },
      () => (release ? 'abort' : undefined)));
    assert.ok(await waitFor(async () => (await gauge('dsv4:num_requests_running')) === 32, 30000), 'all slots taken');
    const body = JSON.stringify({ model: 'tiny', prompt: promptOf(7), max_tokens: 300, ignore_eos: true });
    const head = `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n`;
    // A non-streaming client that gives up after 1.5 s: its socket closes while the request waits.
    const exchange = rawExchange(server, Buffer.from(head + body), { limitMs: 1500 });
    const queued = await waitFor(async () => (await gauge('dsv4:num_requests_waiting')) === 1, 1400, 20);
    const gaveUp = await exchange;
    assert.ok(queued, 'the request waited for a slot');
    assert.equal(gaveUp.status, -1, 'no answer before the client left');
    assert.ok(await waitFor(async () => (await gauge('dsv4:num_requests_waiting')) === 0, 2000, 20), 'it left the queue at once (within a step)');
    assert.equal(await gauge('dsv4:num_requests_running'), 32, 'the running streams go on');
    release = true;
    await Promise.all(blockers);
    const { idle, metrics: m } = await waitIdle(server, 5000);
    assert.ok(idle, `pages back to idle: ${m['dsv4:kv_cache_pages_in_use']} in use`);
    assert.equal(m['dsv4:request_success_total{model_name="tiny",finished_reason="abort"}'] -
      base['dsv4:request_success_total{model_name="tiny",finished_reason="abort"}'], 33);
  });
});
