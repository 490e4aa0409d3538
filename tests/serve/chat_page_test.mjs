// The chat page at GET / in a real browser: Debian's chromium, headless, driven by playwright-core
// (tools/npm; it downloads no browser of its own). One conversation against `dsv4 serve` with
// the tiny model and an API key: the loading state, the key typed into the page, a streamed reply
// with its stats, a thinking turn, the server's error message, a tool call, and Stop in the middle
// of a long reply. Screenshots of the end state go to DSV4_ARTIFACT_DIR (light and dark).
// DSV4_CHROMIUM names another chromium binary than /usr/bin/chromium.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { metrics, rawRequest, requireNpm, sleep, startServer, waitFor, waitIdle } from './server_harness.mjs';

const chromiumPath = process.env.DSV4_CHROMIUM ?? '/usr/bin/chromium';
const artifactDir = process.env.DSV4_ARTIFACT_DIR ?? path.resolve('artifacts');
const kKey = 'sesame';
const kWaitMs = 60000;  // every wait on the page is bounded by this
const lastAnswer = '.msg.assistant:last-child';

function launchChromium() {
  if (!fs.existsSync(chromiumPath))
    throw new Error(`chromium is not installed (${chromiumPath} is missing): run scripts/setup.sh, which installs Debian's chromium package`);
  const { chromium } = requireNpm('playwright-core');
  return chromium.launch({ executablePath: chromiumPath, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
}

describe('the chat page', () => {
  let browser, server, page;
  const pageErrors = [];
  before(async () => {
    browser = await launchChromium();
    // Loading is held back a few seconds so that the page sees the server before it is ready.
    server = await startServer(['--api-key', kKey, '--startup-delay', '4', '--max-model-len', '8192'], { healthy: false });
    page = await browser.newPage({ viewport: { width: 1280, height: 960 } });
    page.setDefaultTimeout(kWaitMs);
    page.on('pageerror', (e) => pageErrors.push(`uncaught: ${e.message}`));
    page.on('console', (m) => { if (/Content.Security.Policy/i.test(m.text())) pageErrors.push(`CSP: ${m.text()}`); });
  });
  after(async () => {
    await browser?.close().catch(() => {});
    if (server) {
      const code = await server.stop();
      assert.equal(code, 0, `server exit code ${code}\n${server.log}`);
    }
  });

  const answerState = (state) => page.waitForSelector(`${lastAnswer}[data-state="${state}"]`);
  // Sends `text` with the settings given (ids of the settings fields) and resolves with the
  // request the page made.
  async function send(text, settings = {}) {
    for (const [id, value] of Object.entries(settings)) await page.fill(`#${id}`, String(value));
    await page.fill('#input', text);
    const request = page.waitForRequest((r) => r.url().endsWith('/v1/chat/completions'));
    await page.press('#input', 'Enter');
    return request;
  }

  test('GET / serves the page without the API key; /v1 still needs it', async () => {
    for (const target of ['/', '/index.html']) {
      const res = await rawRequest(server, 'GET', target);
      assert.equal(res.status, 200, target);
      assert.equal(res.headers['content-type'], 'text/html; charset=utf-8');
      assert.match(res.headers['content-security-policy'], /connect-src 'self'/);
      assert.match(res.body, /<title>dsv4 chat<\/title>/);
    }
    assert.equal((await rawRequest(server, 'GET', '/v1/models')).status, 401);
  });

  test('the page shows the loading model, then asks for the key, then is ready', async () => {
    await page.goto(server.url);
    await page.waitForSelector('#status[data-state="loading"]', { timeout: 3000 });
    assert.match(await page.textContent('#banner'), /loading/);
    assert.ok(await page.isDisabled('#send'));
    await page.waitForSelector('#status[data-state="unauthorized"]');
    await page.fill('#api-key', kKey);
    await page.press('#api-key', 'Tab');  // the change event checks the server again
    await page.waitForSelector('#status[data-state="ready"]');
    assert.ok(await page.isHidden('#banner'));
    assert.match(await page.textContent('#model'), /^tiny · 8192 tokens context$/);
    const saved = await page.evaluate(() => JSON.parse(localStorage.getItem('dsv4.chat.settings')));
    assert.equal(saved['api-key'], kKey, 'the key stays in localStorage');
  });

  test('a reply streams in, is the server\'s greedy answer, and gets tokens/s and TTFT', async () => {
    // Every content length the page shows, with the answer's state at that moment.
    await page.evaluate(() => {
      window.samples = [];
      new MutationObserver(() => {
        const answer = document.querySelector('.msg.assistant:last-child');
        if (answer) window.samples.push({ state: answer.dataset.state, length: answer.querySelector('.content').textContent.length });
      }).observe(document.getElementById('messages'), { subtree: true, childList: true, characterData: true });
    });
    const request = await send('Hello, DeepSeek', { temperature: 0, 'max-tokens': 48 });
    await answerState('done');
    const body = request.postDataJSON();
    assert.equal(request.headers().authorization, `Bearer ${kKey}`);
    assert.deepEqual(body.messages, [{ role: 'user', content: 'Hello, DeepSeek' }]);
    assert.equal(body.stream, true);
    assert.deepEqual(body.stream_options, { include_usage: true });
    assert.deepEqual(body.chat_template_kwargs, { thinking: false });
    assert.equal(body.max_tokens, 48);

    const text = await page.textContent(`${lastAnswer} .content`);
    const whole = await fetch(`${server.url}/v1/chat/completions`, {
      method: 'POST', headers: { Authorization: `Bearer ${kKey}` }, body: JSON.stringify({ ...body, stream: false, stream_options: undefined }),
    }).then((r) => r.json());
    assert.equal(text, whole.choices[0].message.content, 'the page shows the text the server generates');
    const samples = await page.evaluate(() => window.samples);
    const partial = new Set(samples.filter((s) => s.state === 'streaming' && s.length > 0 && s.length < text.length).map((s) => s.length));
    assert.ok(partial.size >= 2, `the text grows while streaming (partial lengths seen: ${[...partial]})`);

    const stats = await page.$eval(`${lastAnswer} .stats`, (el) => ({ text: el.textContent, ...el.dataset }));
    assert.equal(stats.tokens, '48');
    assert.equal(stats.tokensFrom, 'usage');
    assert.ok(Number(stats.ttftMs) > 0 && Number(stats.tokensPerSecond) > 0, JSON.stringify(stats));
    assert.match(stats.text, /^48 tokens · [\d.]+ tok\/s · TTFT \d+ ms · finish: length$/);
  });

  test('a thinking turn sends the history and shows the reasoning folded', async () => {
    const first = await page.textContent(`${lastAnswer} .content`);
    await page.check('#think');
    const request = await send('Think about it', { 'max-tokens': 12 });
    await answerState('done');
    const body = request.postDataJSON();
    assert.deepEqual(body.chat_template_kwargs, { thinking: true });
    assert.deepEqual(body.messages, [
      { role: 'user', content: 'Hello, DeepSeek' }, { role: 'assistant', content: first }, { role: 'user', content: 'Think about it' }]);
    const reasoning = await page.$eval(`${lastAnswer} details.reasoning`, (el) => ({ open: el.open, text: el.querySelector('.text').textContent }));
    assert.ok(reasoning.text.length > 0, 'the reasoning is shown');
    assert.equal(reasoning.open, false, 'and folded once the answer is complete');
    await page.uncheck('#think');
  });

  test('an error shows the server\'s message and gives the text back', async () => {
    await send('Too long', { 'max-tokens': 10 ** 12 });
    await answerState('error');
    assert.match(await page.textContent(`${lastAnswer} .error`), /^400 context_length_exceeded: .*maximum context length is 8192 tokens/);
    assert.equal(await page.inputValue('#input'), 'Too long');
    await page.fill('#input', '');
  });

  test('tool calls are shown as blocks, and the tools list is sent', async () => {
    // The tiny model's text is noise and never a call: the server's reply is replaced here by a
    // stream of the shape openai_stream.cpp sends.
    const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
    const chunk = (delta, finish = null) => ({ id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 0, model: 'tiny',
      choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }], usage: null });
    const events = [
      chunk({ role: 'assistant', content: 'Let me look that up.' }),
      chunk({ tool_calls: [{ index: 0, id: 'chatcmpl-1-call-0', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] }),
      chunk({}, 'tool_calls'),
      { id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 0, model: 'tiny', choices: [], usage: { prompt_tokens: 9, completion_tokens: 12, total_tokens: 21 } },
    ];
    let sent;
    await page.route('**/v1/chat/completions', (route) => {
      sent = route.request().postDataJSON();
      route.fulfill({ status: 200, contentType: 'text/event-stream', body: events.map((e) => `data: ${JSON.stringify(e)}\n\n`).join('') + 'data: [DONE]\n\n' });
    });
    try {
      await page.fill('#tools', JSON.stringify(tools));
      await send('Weather in Paris?', { 'max-tokens': 32 });
      await answerState('done');
    } finally {
      await page.unroute('**/v1/chat/completions');
    }
    assert.deepEqual(sent.tools, tools);
    assert.equal(await page.textContent(`${lastAnswer} .tool-call .name`), 'get_weather');
    assert.equal(await page.textContent(`${lastAnswer} .tool-call pre`), '{\n  "city": "Paris"\n}');
    assert.match(await page.textContent(`${lastAnswer} .stats`), /^12 tokens · .* · finish: tool_calls$/);
    await page.fill('#tools', '');
  });

  test('Stop ends a long reply, keeps its partial text, and the server goes idle', async () => {
    const before = await metrics(server);
    const request = await send('Write a long story', { 'max-tokens': 8000 });
    assert.equal(request.postDataJSON().messages.at(-2).tool_calls[0].function.name, 'get_weather', 'the tool call is in the history');
    const seen = await waitFor(async () => (await page.textContent(`${lastAnswer} .content`)).length >= 40, kWaitMs);
    assert.ok(seen, 'the long reply streams');
    await page.click('#stop');
    await answerState('stopped');
    const partial = await page.textContent(`${lastAnswer} .content`);
    assert.ok(partial.length >= 40, 'the partial text stays');
    const { idle, metrics: after } = await waitIdle(server);
    assert.ok(idle, 'the server has no request left running');
    const aborted = 'dsv4:request_success_total{model_name="tiny",finished_reason="abort"}';
    assert.equal((after[aborted] ?? 0) - (before[aborted] ?? 0), 1, 'the server cancelled the request');
    assert.ok(after['dsv4:generation_tokens_total'] - before['dsv4:generation_tokens_total'] < 8000);
    await sleep(300);
    assert.equal(await page.textContent(`${lastAnswer} .content`), partial, 'nothing more arrives');
    const stats = await page.$eval(`${lastAnswer} .stats`, (el) => ({ text: el.textContent, ...el.dataset }));
    assert.equal(stats.tokensFrom, 'chunks');
    assert.match(stats.text, /^≈ \d+ tokens · [\d.]+ tok\/s · TTFT \d+ ms · stopped$/);
    assert.ok(await page.isEnabled('#send') && await page.isHidden('#stop'));
  });

  test('the page ran without script errors; screenshots', async () => {
    assert.deepEqual(pageErrors, []);
    await page.fill('#input', 'A next question…');
    fs.mkdirSync(artifactDir, { recursive: true });
    for (const scheme of ['light', 'dark']) {
      await page.emulateMedia({ colorScheme: scheme });
      const file = path.join(artifactDir, scheme === 'light' ? 'chat_page.png' : 'chat_page_dark.png');
      await page.screenshot({ path: file });
      console.log(`screenshot: ${file}`);
    }
  });
});
