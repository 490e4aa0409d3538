// Bad input never takes the server down: each case is sent as raw HTTP (what a client library
// would refuse to send), answered with its status and an OpenAI error naming the problem, and
// afterwards the server is still healthy, serves a normal request and its cache is idle.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { healthStatus, rawExchange, rawRequest, startServer, waitIdle } from './server_harness.mjs';

const kMaxRequestBytes = 65536;
const chat = (fields) => JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, ...fields });
const completion = (fields) => JSON.stringify({ model: 'tiny', prompt: 'hi', max_tokens: 2, ...fields });

// [name, method, route, body (string | Buffer), status, message pattern, param]
const cases = [
  ['malformed JSON', 'POST', '/v1/chat/completions', '{"model": "tiny", "messages": [}', 400, /JSON|parse/i],
  ['truncated JSON', 'POST', '/v1/chat/completions', chat({}).slice(0, 40), 400, /JSON|parse|truncated|end of input/i],
  ['empty body', 'POST', '/v1/chat/completions', '', 400, /JSON|parse|empty/i],
  ['body is not an object', 'POST', '/v1/completions', '[1, 2, 3]', 400, /object/i],
  ['invalid UTF-8 in the body', 'POST', '/v1/chat/completions',
    Buffer.concat([Buffer.from('{"model":"tiny","max_tokens":2,"messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from('"}]}')]),
    400, /UTF-8|utf-8|invalid/i],
  ['lone surrogate escape', 'POST', '/v1/chat/completions', chat({ messages: [{ role: 'user', content: 'x' }] }).replace('"x"', '"\\ud800"'), 400, /./],
  ['deeply nested JSON', 'POST', '/v1/completions', '{"prompt":' + '['.repeat(20000) + ']'.repeat(20000) + '}', 400, /nest|depth|deep/i],
  ['messages is a string', 'POST', '/v1/chat/completions', chat({ messages: 'hi' }), 400, /list/i, 'messages'],
  ['messages missing', 'POST', '/v1/chat/completions', JSON.stringify({ model: 'tiny' }), 400, /required/i, 'messages'],
  ['message without content', 'POST', '/v1/chat/completions', chat({ messages: [{ role: 'user' }] }), 400, /required/i, 'messages[0].content'],
  ['unknown role', 'POST', '/v1/chat/completions', chat({ messages: [{ role: 'wizard', content: 'x' }] }), 400, /role/i, 'messages[0].role'],
  ['max_tokens as a string', 'POST', '/v1/chat/completions', chat({ max_tokens: '8' }), 400, /integer/i, 'max_tokens'],
  ['temperature as a string', 'POST', '/v1/completions', completion({ temperature: 'hot' }), 400, /number/i, 'temperature'],
  ['stream as a string', 'POST', '/v1/completions', completion({ stream: 'yes' }), 400, /boolean/i, 'stream'],
  ['temperature out of range', 'POST', '/v1/chat/completions', chat({ temperature: 3 }), 400, /temperature/, 'temperature'],
  ['top_p zero', 'POST', '/v1/chat/completions', chat({ top_p: 0 }), 400, /top_p/, 'top_p'],
  ['top_k negative', 'POST', '/v1/completions', completion({ top_k: -5 }), 400, /top_k/, 'top_k'],
  ['n = 2', 'POST', '/v1/chat/completions', chat({ n: 2 }), 400, /n/, 'n'],
  ['presence_penalty out of range', 'POST', '/v1/completions', completion({ presence_penalty: 5 }), 400, /presence_penalty/, 'presence_penalty'],
  ['top_logprobs out of range', 'POST', '/v1/chat/completions', chat({ logprobs: true, top_logprobs: 50 }), 400, /top_logprobs/, 'top_logprobs'],
  ['max_tokens zero', 'POST', '/v1/completions', completion({ max_tokens: 0 }), 400, /max_tokens/, 'max_tokens'],
  ['max_tokens negative', 'POST', '/v1/completions', completion({ max_tokens: -1 }), 400, /max_tokens/, 'max_tokens'],
  ['huge max_tokens', 'POST', '/v1/chat/completions', chat({ max_tokens: 1e15 }), 400, /maximum context length/, 'max_tokens'],
  ['max_tokens past int64', 'POST', '/v1/completions', completion({ max_tokens: 1e300 }), 400, /max_tokens/, 'max_tokens'],
  ['prompt longer than the model length', 'POST', '/v1/completions', completion({ prompt: 'lorem ipsum '.repeat(400) }), 400,
    /maximum context length is 256 tokens/, 'prompt'],
  ['token id outside the vocabulary', 'POST', '/v1/completions', completion({ prompt: [1, 2, 1 << 30] }), 400, /vocabulary/, 'prompt[2]'],
  ['mixed prompt list', 'POST', '/v1/completions', completion({ prompt: ['a', [1, 2]] }), 400, /must be a string/, 'prompt[1]'],
  ['unknown model', 'POST', '/v1/completions', completion({ model: 'gpt-9' }), 404, /does not exist/, 'model'],
  ['unknown route', 'POST', '/v1/embeddings', '{}', 404, /No route/],
  ['GET on a POST route', 'GET', '/v1/chat/completions', undefined, 404, /No route/],
  ['detokenize an unknown id', 'POST', '/detokenize', JSON.stringify({ tokens: [1 << 30] }), 400, /vocabulary/, 'tokens[0]'],
  ['tokenize without prompt', 'POST', '/tokenize', '{}', 400, /required/, 'prompt'],
  ['body over the size limit', 'POST', '/v1/completions', completion({ prompt: 'x'.repeat(kMaxRequestBytes) }), 413, /larger than the limit/],
];

describe('bad input to dsv4 serve', () => {
  let server;
  before(async () => {
    server = await startServer(['--max-model-len', '256', '--max-request-bytes', String(kMaxRequestBytes)]);
  });
  after(async () => {
    const code = await server.stop();
    assert.equal(code, 0, `server exit code ${code}\n${server.log}`);
  });

  const table = [];
  for (const [name, method, route, body, status, pattern, param] of cases) {
    test(name, async () => {
      const res = await rawRequest(server, method, route, body);
      table.push(`${String(res.status).padEnd(4)} ${name.padEnd(38)} ${res.body.slice(0, 150)}`);
      assert.equal(res.status, status, res.body);
      const error = JSON.parse(res.body).error;
      assert.equal(typeof error.message, 'string');
      assert.match(error.message, pattern);
      assert.ok('type' in error && 'param' in error && 'code' in error, 'the OpenAI error shape');
      if (param !== undefined) assert.equal(error.param, param);
    });
  }

  test('unknown fields are accepted and ignored (as vLLM does)', async () => {
    const res = await rawRequest(server, 'POST', '/v1/chat/completions', chat({ frobnicate: { deep: [1, 2] }, user: 'me' }));
    assert.equal(res.status, 200, res.body);
  });

  test('broken HTTP: a bad request line, a body shorter than Content-Length, a half-sent stream, headers too large', async () => {
    const garbage = await rawExchange(server, Buffer.from('BLAH\r\n\r\n'));
    assert.ok(garbage.status === 400 || garbage.status === -1, `status ${garbage.status}`);
    const short = await rawExchange(server, Buffer.from('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{"prompt":'), {
      halfClose: true,
    });
    assert.ok(short.status === 400 || short.status === -1, `status ${short.status}`);
    const headers = await rawExchange(server, Buffer.from(`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20000)}\r\n\r\n`));
    assert.ok(headers.status >= 400 || headers.status === -1, `status ${headers.status}`);
  });

  test('the server is still healthy, serves, and its cache is idle', async () => {
    console.log(`bad-input table (status, case, answer):\n${table.join('\n')}`);
    assert.equal(await healthStatus(server), 200);
    const res = await rawRequest(server, 'POST', '/v1/chat/completions', chat({ temperature: 0 }));
    assert.equal(res.status, 200, res.body);
    assert.equal(JSON.parse(res.body).usage.completion_tokens, 2);
    assert.ok((await waitIdle(server)).idle);
  });
});
