// A bounded soak: DSV4_SOAK_CLIENTS (default 64) clients send requests for DSV4_SOAK_SECONDS
// (default 20) — chat and completions, streamed or not, random prompt lengths and max_tokens,
// greedy or sampled, some malformed, a quarter dropped at a random point. Afterwards: zero server
// errors (5xx, error events, connections closed without an answer that the client did not drop),
// the cache drained to zero pages, and no growth of the resident memory between the drain after a
// warm-up round and the drain at the end. The figures are printed.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { healthStatus, metrics, sleep, startServer, waitIdle } from './server_harness.mjs';

const seconds = Number(process.env.DSV4_SOAK_SECONDS ?? 20);
const clients = Number(process.env.DSV4_SOAK_CLIENTS ?? 64);
const seed = Number(process.env.DSV4_SOAK_SEED ?? 1234);
const kRssGrowthLimit = 48 << 20;

// mulberry32: a small seeded generator, so a failing soak can be replayed.
function generator(state) {
  return () => {
    state = (state + 0x6d2b79f5) | 0;
    let t = Math.imul(state ^ (state >>> 15), 1 | state);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const words = ['the', 'model', 'stream', 'token', 'cache', 'page', 'deep', 'seek', 'fast', 'serve', 'bits', 'ünïcödé', '数据', '🙂'];

function randomRequest(random) {
  const int = (lo, hi) => lo + Math.floor(random() * (hi - lo + 1));
  const chat = random() < 0.5;
  const stream = random() < 0.7;
  const body = { model: 'tiny', max_tokens: int(1, 16), temperature: random() < 0.5 ? 0 : 0.8, seed: int(0, 1000), stream };
  if (stream && random() < 0.5) body.stream_options = { include_usage: true };
  const length = int(1, 100);
  if (chat) {
    body.messages = [{ role: 'user', content: Array.from({ length: Math.ceil(length / 2) }, () => words[int(0, words.length - 1)]).join(' ') }];
  } else {
    body.prompt = Array.from({ length }, () => int(100, 90000));
  }
  if (random() < 0.1) body.stop = [words[int(0, words.length - 1)]];
  const malformed = random() < 0.05;
  return {
    route: chat ? '/v1/chat/completions' : '/v1/completions',
    text: malformed ? JSON.stringify(body).slice(0, int(1, 30)) : JSON.stringify(body),
    malformed,
    stream,
    drop: !malformed && random() < 0.25 ? { afterChunks: int(0, 6), afterMs: int(0, 1500) } : null,
  };
}

// One request; returns its outcome: ok | dropped | rejected (expected 400) | an error string.
async function send(server, request) {
  const controller = new AbortController();
  let timer = null;
  if (request.drop && !request.stream) timer = setTimeout(() => controller.abort(), request.drop.afterMs);
  try {
    const res = await fetch(`${server.url}${request.route}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: request.text, signal: controller.signal,
    });
    if (request.malformed) {
      await res.text();
      return res.status === 400 ? 'rejected' : `malformed request answered ${res.status}`;
    }
    if (res.status !== 200) return `status ${res.status}: ${(await res.text()).slice(0, 200)}`;
    if (!request.stream) {
      const body = await res.json();
      return body.choices?.length === 1 ? 'ok' : `bad body ${JSON.stringify(body).slice(0, 200)}`;
    }
    const decoder = new TextDecoder();
    let pending = '', chunks = 0, done = false;
    for await (const piece of res.body) {
      pending += decoder.decode(piece, { stream: true });
      let split;
      while ((split = pending.indexOf('\n\n')) >= 0) {
        const data = pending.slice(6, split);
        pending = pending.slice(split + 2);
        if (data === '[DONE]') done = true;
        else if (JSON.parse(data).error) return `error event ${data.slice(0, 200)}`;
        chunks += 1;
        if (request.drop && chunks > request.drop.afterChunks) {
          controller.abort();
          return 'dropped';
        }
      }
    }
    return done ? 'ok' : 'stream ended without [DONE]';
  } catch (e) {
    if (e.name === 'AbortError' && request.drop) return 'dropped';
    return `client error ${e.message}`;
  } finally {
    clearTimeout(timer);
  }
}

async function load(server, durationMs, random, tally) {
  const end = Date.now() + durationMs;
  await Promise.all(Array.from({ length: clients }, async () => {
    while (Date.now() < end) {
      const outcome = await send(server, randomRequest(random));
      tally[outcome] = (tally[outcome] ?? 0) + 1;
    }
  }));
}

test(`soak: ${clients} clients for ${seconds} s`, { timeout: (seconds + 240) * 1000 }, async () => {
  const server = await startServer(['--max-model-len', '512', '--max-num-seqs', '64', '--max-num-batched-tokens', '2048']);
  try {
    const random = generator(seed);
    const tally = {};
    const warmupMs = Math.min(5000, seconds * 250);
    await load(server, warmupMs, random, tally);
    const warm = await waitIdle(server, 30000);
    assert.ok(warm.idle, 'drained after the warm-up');
    const rssWarm = server.rss();
    const started = Date.now();
    await load(server, seconds * 1000 - warmupMs, random, tally);
    const drainStarted = Date.now();
    const drained = await waitIdle(server, 30000);
    const drainMs = Date.now() - drainStarted;
    await sleep(200);
    const rssEnd = server.rss();
    const m = await metrics(server);
    const errors = Object.entries(tally).filter(([k]) => !['ok', 'dropped', 'rejected'].includes(k));
    const total = Object.values(tally).reduce((a, b) => a + b, 0);
    console.log([
      `soak: ${clients} clients, ${seconds} s (seed ${seed}): ${total} requests ${JSON.stringify(tally)}`,
      `  generated ${m['dsv4:generation_tokens_total']} tokens, prompts ${m['dsv4:prompt_tokens_total']} tokens; ` +
        `finished ${JSON.stringify(Object.fromEntries(Object.entries(m).filter(([k]) => k.startsWith('dsv4:request_success_total{'))
          .map(([k, v]) => [k.match(/finished_reason="(\w+)"/)[1], v])))}`,
      `  drained in ${drainMs} ms to ${m['dsv4:kv_cache_pages_in_use']} cache pages (warm-up drain: ${warm.metrics['dsv4:kv_cache_pages_in_use']})`,
      `  RSS after warm-up ${(rssWarm / 2 ** 20).toFixed(1)} MiB, after the soak ${(rssEnd / 2 ** 20).toFixed(1)} MiB ` +
        `(growth ${((rssEnd - rssWarm) / 2 ** 20).toFixed(1)} MiB over ${((drainStarted - started) / 1000).toFixed(0)} s)`,
    ].join('\n'));
    assert.deepEqual(errors, [], 'no server errors');
    assert.ok(drained.idle, 'the cache drained to zero pages');
    assert.ok(rssEnd - rssWarm < kRssGrowthLimit, `RSS grew by ${rssEnd - rssWarm} bytes`);
    assert.ok(tally.ok > 0 && tally.dropped > 0, 'both completed and dropped requests happened');
    assert.equal(await healthStatus(server), 200);
  } finally {
    const code = await server.stop();
    assert.equal(code, 0, `server exit code ${code}\n${server.log.slice(-4000)}`);
  }
});
