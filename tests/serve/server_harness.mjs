// What the end-to-end server tests share: starting the real `dsv4 serve` binary on a free
// loopback port (--port 0; the port is read from its "listening on" log line), waiting until it
// is healthy, stopping it (SIGTERM, bounded; SIGKILL after), the official openai client, raw HTTP
// for what a client library would refuse to send, SSE parsing and /metrics parsing.
//
// Environment (set by tests/serve/CMakeLists.txt): DSV4_BINARY, DSV4_TINY_MODEL (a make-tiny
// directory), DSV4_NPM_DIR (tools/npm, where scripts/setup.sh installs the openai package).
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';

export const binary = process.env.DSV4_BINARY;
export const modelDir = process.env.DSV4_TINY_MODEL;
const npmDir = process.env.DSV4_NPM_DIR;

// A package of tools/npm, or an error that says how to install it.
export function requireNpm(name) {
  const require = createRequire(path.join(npmDir, 'package.json'));
  try {
    return require(name);
  } catch (e) {
    throw new Error(`the ${name} npm package is missing under ${npmDir} (run scripts/setup.sh): ${e.message}`);
  }
}

export function loadOpenAI() {
  return requireNpm('openai').OpenAI;
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Polls `condition` (async) every `interval` ms until it is truthy or `limitMs` passed.
export async function waitFor(condition, limitMs, interval = 50) {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const value = await condition();
    if (value) return value;
    if (Date.now() > deadline) return value;
    await sleep(interval);
  }
}

export class Server {
  constructor(proc) {
    this.proc = proc;
    this.log = '';
    this.exitCode = null;
    this.exited = new Promise((resolve) => proc.on('exit', (code, signal) => {
      this.exitCode = code ?? signal;
      resolve(this.exitCode);
    }));
  }
  get pid() { return this.proc.pid; }
  get url() { return `http://127.0.0.1:${this.port}`; }

  // SIGTERM, then SIGKILL if it has not exited within `limitMs`. Returns the exit code.
  async stop(limitMs = 20000) {
    if (this.exitCode !== null) return this.exitCode;
    this.proc.kill('SIGTERM');
    const timer = setTimeout(() => this.proc.kill('SIGKILL'), limitMs);
    const code = await this.exited;
    clearTimeout(timer);
    return code;
  }

  // Resident set size from /proc (bytes).
  rss() {
    const status = fs.readFileSync(`/proc/${this.pid}/status`, 'utf8');
    const match = status.match(/VmRSS:\s+(\d+) kB/);
    return match ? Number(match[1]) * 1024 : -1;
  }
}

// Starts `dsv4 serve` and resolves once the port is known; with `healthy` (default) once
// GET /health answers 200.
export async function startServer(extraArgs = [], { healthy = true, limitMs = 120000 } = {}) {
  const args = ['serve', '--model', modelDir, '--port', '0', '--served-model-name', 'tiny', ...extraArgs];
  const proc = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  const server = new Server(proc);
  const onData = (chunk) => {
    server.log += chunk.toString();
    if (server.port === undefined) {
      const match = server.log.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (match) server.port = Number(match[1]);
    }
  };
  proc.stdout.on('data', onData);
  proc.stderr.on('data', onData);
  const started = await waitFor(() => server.port !== undefined || server.exitCode !== null, limitMs);
  if (!started || server.port === undefined) {
    await server.stop();
    throw new Error(`dsv4 serve did not start:\n${server.log}`);
  }
  if (healthy) {
    const ok = await waitFor(async () => (await healthStatus(server)) === 200 || server.exitCode !== null, limitMs, 100);
    if (!ok || server.exitCode !== null) {
      await server.stop();
      throw new Error(`dsv4 serve did not become healthy:\n${server.log}`);
    }
  }
  return server;
}

export async function healthStatus(server) {
  try {
    const res = await fetch(`${server.url}/health`);
    await res.arrayBuffer();
    return res.status;
  } catch {
    return -1;
  }
}

export function client(server, options = {}) {
  const OpenAI = loadOpenAI();
  return new OpenAI({ apiKey: 'unused', baseURL: `${server.url}/v1`, maxRetries: 0, timeout: 120000, ...options });
}

// Prometheus text → { 'name{labels}': value }, and by bare name the sum over label sets.
export async function metrics(server) {
  const res = await fetch(`${server.url}/metrics`);
  const text = await res.text();
  const values = { _text: text };
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const match = line.match(/^([^\s{]+)(\{[^}]*\})?\s+(\S+)$/);
    if (!match) continue;
    const value = Number(match[3]);
    values[match[1] + (match[2] ?? '')] = value;
    values[match[1]] = (values[match[1]] ?? 0) + value;
  }
  return values;
}

// Cache pages back to idle (0 in use, nothing running or waiting) within `limitMs`.
export async function waitIdle(server, limitMs = 20000) {
  let last;
  const idle = await waitFor(async () => {
    last = await metrics(server);
    return last['dsv4:kv_cache_pages_in_use'] === 0 && last['dsv4:num_requests_running'] === 0 &&
      last['dsv4:num_requests_waiting'] === 0;
  }, limitMs, 50);
  return { idle: Boolean(idle), metrics: last };
}

// One HTTP/1.1 exchange on a fresh socket with exactly these bytes. Resolves with
// { status, headers, body } once a whole response has arrived (the socket is then closed), or
// { status: -1 } when the server closed without answering or `limitMs` passed.
export function rawExchange(server, bytes, { limitMs = 30000, halfClose = false } = {}) {
  return new Promise((resolve) => {
    const socket = net.connect(server.port, '127.0.0.1');
    const chunks = [];
    let settled = false;
    const settle = () => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      resolve(parseResponse(Buffer.concat(chunks)));
    };
    const timer = setTimeout(settle, limitMs);
    socket.on('connect', () => {
      socket.write(bytes);
      if (halfClose) socket.end();
    });
    socket.on('data', (d) => {
      chunks.push(d);
      if (responseComplete(Buffer.concat(chunks))) settle();
    });
    socket.on('close', settle);
    socket.on('error', () => {});
  });
}

// Headers and the whole body by Content-Length, or the last chunk of a chunked body.
function responseComplete(buffer) {
  const end = buffer.indexOf('\r\n\r\n');
  if (end < 0) return false;
  const head = buffer.subarray(0, end).toString('latin1').toLowerCase();
  const length = head.match(/\r\ncontent-length:\s*(\d+)/);
  if (length) return buffer.length - end - 4 >= Number(length[1]);
  if (head.includes('transfer-encoding: chunked')) return buffer.subarray(end).includes('\r\n0\r\n\r\n');
  return false;
}

export function rawRequest(server, method, target, body, headers = {}) {
  const payload = body === undefined ? Buffer.alloc(0) : Buffer.isBuffer(body) ? body : Buffer.from(body);
  let head = `${method} ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n`;
  for (const [k, v] of Object.entries(headers)) head += `${k}: ${v}\r\n`;
  if (!('Content-Length' in headers) && body !== undefined) head += `Content-Length: ${payload.length}\r\n`;
  if (body !== undefined && !('Content-Type' in headers)) head += 'Content-Type: application/json\r\n';
  return rawExchange(server, Buffer.concat([Buffer.from(head + '\r\n'), payload]));
}

function parseResponse(buffer) {
  const text = buffer.toString('latin1');
  const end = text.indexOf('\r\n\r\n');
  if (end < 0) return { status: -1, headers: {}, body: '' };
  const lines = text.slice(0, end).split('\r\n');
  const status = Number(lines[0].split(' ')[1]);
  const headers = {};
  for (const line of lines.slice(1)) {
    const colon = line.indexOf(':');
    headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
  }
  let body = buffer.subarray(end + 4);
  if ((headers['transfer-encoding'] ?? '').includes('chunked')) body = dechunk(body);
  return { status, headers, body: body.toString('utf8') };
}

function dechunk(body) {
  const parts = [];
  let at = 0;
  while (at < body.length) {
    const lineEnd = body.indexOf('\r\n', at);
    if (lineEnd < 0) break;
    const size = parseInt(body.subarray(at, lineEnd).toString(), 16);
    if (!(size > 0)) break;
    parts.push(body.subarray(lineEnd + 2, lineEnd + 2 + size));
    at = lineEnd + 2 + size + 2;
  }
  return Buffer.concat(parts);
}

// POST `body` with stream: true over fetch and hand each SSE event's data to onEvent(data, index)
// as it arrives; onEvent returning 'abort' drops the connection there. Resolves with
// { status, events, aborted }.
export async function streamEvents(server, route, body, onEvent = () => {}) {
  const controller = new AbortController();
  const res = await fetch(`${server.url}${route}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body), signal: controller.signal,
  });
  const events = [];
  if (res.status !== 200) return { status: res.status, events, body: await res.text() };
  const decoder = new TextDecoder();
  let pending = '', aborted = false;
  try {
    for await (const chunk of res.body) {
      pending += decoder.decode(chunk, { stream: true });
      let split;
      while ((split = pending.indexOf('\n\n')) >= 0) {
        const event = pending.slice(0, split);
        pending = pending.slice(split + 2);
        if (!event.startsWith('data: ')) throw new Error(`not an SSE data event: ${JSON.stringify(event)}`);
        const data = event.slice(6);
        events.push(data);
        if (onEvent(data, events.length - 1) === 'abort') {
          aborted = true;  // leaving the loop rejects with AbortError: the flag survives that
          controller.abort();
          return { status: res.status, events, aborted };
        }
      }
    }
  } catch (e) {
    if (e.name !== 'AbortError') throw e;
  }
  return { status: res.status, events, aborted, rest: pending };
}
