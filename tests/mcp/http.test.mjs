// The daemon's /mcp endpoint (MCP Streamable HTTP), driven by the SDK's
// StreamableHTTPClientTransport over loopback TCP, plus raw HTTP checks of
// sessions, methods and authentication (TCP bearer token, unix socket).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

import { BIN, makeSandboxDirs, LineLog, SESSION_TOOLS } from './lib.mjs';

let dirs;
let daemon;
let daemonLog;
let address;   // "127.0.0.1:PORT"
let socket;    // the unix socket path
let token;

before(async () => {
  dirs = makeSandboxDirs();
  token = crypto.randomBytes(24).toString('hex');
  const tokenFile = path.join(dirs.root, 'token');
  fs.writeFileSync(tokenFile, token + '\n', { mode: 0o600 });
  socket = path.join(dirs.root, 'agentbox.sock');
  daemon = spawn(BIN, ['serve', '--state-dir', dirs.stateDir, '--socket', socket,
    '--listen', '127.0.0.1:0', '--token-file', tokenFile], { stdio: ['ignore', 'ignore', 'pipe'] });
  daemonLog = new LineLog(daemon.stderr);
  const failed = new Promise((_, reject) => {
    daemon.on('error', reject);
    daemon.on('exit', (code) => reject(new Error(`agentbox serve exited (${code}):\n${daemonLog.text}`)));
  });
  const m = await Promise.race([daemonLog.waitFor(/^\{.*"event":"listening".*$/m), failed]);
  address = JSON.parse(m[0]).address;
  assert.match(address, /^127\.0\.0\.1:\d+$/);
});

after(async () => {
  if (daemon && daemon.pid && daemon.exitCode === null && daemon.signalCode === null) {
    const exited = new Promise((resolve) => daemon.on('exit', resolve));
    daemon.kill('SIGTERM');
    const t = setTimeout(() => daemon.kill('SIGKILL'), 30000);
    await exited;
    clearTimeout(t);
  }
  if (dirs) dirs.cleanup();
});

function mcpUrl(query = { workspace: dirs.workspace, policy: dirs.policy }) {
  const url = new URL(`http://${address}/mcp`);
  for (const [k, v] of Object.entries(query)) url.searchParams.set(k, v);
  return url;
}

async function connect(name) {
  const transport = new StreamableHTTPClientTransport(mcpUrl(), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  const client = new Client({ name, version: '1.0.0' });
  await client.connect(transport);
  return { client, transport };
}

function text(result) {
  assert.equal(result.content[0].type, 'text');
  return result.content[0].text;
}

const INIT = { jsonrpc: '2.0', id: 1, method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '1' } } };

// One HTTP request over TCP (with the token unless told otherwise) or the unix socket.
function request({ method = 'POST', url = mcpUrl(), body, headers = {}, auth = true, unix = false }) {
  return new Promise((resolve, reject) => {
    const h = { Accept: 'application/json, text/event-stream', ...headers };
    if (body !== undefined) h['Content-Type'] = 'application/json';
    if (auth && !unix) h.Authorization = `Bearer ${token}`;
    const options = unix ? { socketPath: socket, path: url.pathname + url.search, method, headers: h }
      : { host: url.hostname, port: url.port, path: url.pathname + url.search, method, headers: h };
    const req = http.request(options, (res) => {
      let data = '';
      res.setEncoding('utf8');
      res.on('data', (c) => { data += c; });
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: data,
        json: () => JSON.parse(data) }));
    });
    req.on('error', reject);
    if (body !== undefined) req.write(typeof body === 'string' ? body : JSON.stringify(body));
    req.end();
  });
}

test('two clients at once, each in a session of its own on the same workspace', async () => {
  const [a, b] = await Promise.all([connect('client-a'), connect('client-b')]);
  try {
    assert.ok(a.transport.sessionId && b.transport.sessionId);
    assert.notEqual(a.transport.sessionId, b.transport.sessionId);
    const [ta, tb] = await Promise.all([a.client.listTools(), b.client.listTools()]);
    assert.equal(ta.tools.length, SESSION_TOOLS.length);
    assert.deepEqual(ta.tools.map((t) => t.name), tb.tools.map((t) => t.name));

    await Promise.all([
      a.client.callTool({ name: 'write_file', arguments: { path: 'who.txt', content: 'A\n' } }),
      b.client.callTool({ name: 'write_file', arguments: { path: 'who.txt', content: 'B\n' } }),
    ]);
    const [ra, rb] = await Promise.all([
      a.client.callTool({ name: 'bash', arguments: { command: 'sleep 1; cat who.txt' } }),
      b.client.callTool({ name: 'bash', arguments: { command: 'sleep 1; cat who.txt' } }),
    ]);
    assert.equal(text(ra), 'A\n');
    assert.equal(text(rb), 'B\n');
    assert.equal(fs.existsSync(path.join(dirs.workspace, 'who.txt')), false, 'the base workspace was written');

    const denied = await a.client.callTool({ name: 'write_file', arguments: { path: '.git/config', content: 'x' } });
    assert.equal(denied.isError, true);
    assert.match(text(denied), /^sandbox_denied: /);
  } finally {
    await Promise.all([a.transport.terminateSession(), b.transport.terminateSession()]);
    await Promise.all([a.client.close(), b.client.close()]);
  }
});

test('progress arrives as an event stream, and a cancelled call ends', async () => {
  const c = await connect('client-progress');
  try {
    const seen = [];
    const r = await c.client.callTool({ name: 'bash', arguments: { command: 'for i in 1 2; do echo tick $i; sleep 1; done' } },
      undefined, { onprogress: (p) => seen.push(p), resetTimeoutOnProgress: true });
    assert.equal(r.isError, false, text(r));
    assert.ok(seen.length >= 1, 'no progress notification');

    const from = daemonLog.mark();
    const controller = new AbortController();
    const pending = c.client.callTool({ name: 'bash', arguments: { command: 'sleep 30' } }, undefined,
      { signal: controller.signal });
    const started = await daemonLog.waitFor(/tools\/call (\S+) bash"/, { from });
    controller.abort('test cancels');
    await assert.rejects(pending);
    await daemonLog.waitFor(new RegExp(`tools/call ${started[1]} bash: cancelled`), { from });
    assert.deepEqual(await c.client.ping(), {});
  } finally {
    await c.transport.terminateSession();
    await c.client.close();
  }
});

test('sessions: header required after initialize, unknown ids 404, DELETE ends one', async () => {
  const init = await request({ body: INIT });
  assert.equal(init.status, 200, init.body);
  const sid = init.headers['mcp-session-id'];
  assert.match(sid, /^[0-9a-f]{32}$/);
  assert.equal(init.json().result.protocolVersion, '2025-06-18');
  assert.match(init.json().result._meta['agentbox/session'], /\S/);

  const ping = { jsonrpc: '2.0', id: 2, method: 'ping' };
  const noHeader = await request({ body: ping });
  assert.equal(noHeader.status, 400);
  assert.match(noHeader.json().error.message, /Mcp-Session-Id header required/);

  const ok = await request({ body: ping, headers: { 'Mcp-Session-Id': sid } });
  assert.equal(ok.status, 200);
  assert.deepEqual(ok.json(), { jsonrpc: '2.0', id: 2, result: {} });

  const note = await request({ body: { jsonrpc: '2.0', method: 'notifications/initialized' }, headers: { 'Mcp-Session-Id': sid } });
  assert.equal(note.status, 202);
  assert.equal(note.body, '');

  const badVersion = await request({ body: ping, headers: { 'Mcp-Session-Id': sid, 'MCP-Protocol-Version': '1999-01-01' } });
  assert.equal(badVersion.status, 400);

  const unknown = await request({ body: ping, headers: { 'Mcp-Session-Id': 'f'.repeat(32) } });
  assert.equal(unknown.status, 404);

  const del = await request({ method: 'DELETE', headers: { 'Mcp-Session-Id': sid } });
  assert.equal(del.status, 204);
  const after = await request({ body: ping, headers: { 'Mcp-Session-Id': sid } });
  assert.equal(after.status, 404);
});

test('GET is 405, a bad body is a JSON-RPC error, initialize needs a workspace', async () => {
  const get = await request({ method: 'GET' });
  assert.equal(get.status, 405);
  assert.match(get.headers.allow, /POST/);

  const garbage = await request({ body: '{not json' });
  assert.equal(garbage.status, 400);
  assert.equal(garbage.json().error.code, -32700);

  const noWorkspace = await request({ url: mcpUrl({}), body: INIT });
  assert.equal(noWorkspace.status, 400);
  assert.match(noWorkspace.json().error.message, /workspace=DIR/);

  const relative = await request({ url: mcpUrl({ workspace: 'relative/dir' }), body: INIT });
  assert.equal(relative.status, 400);
  assert.match(relative.json().error.message, /not an absolute path/);
});

test('authentication: TCP needs the bearer token; a foreign Origin is refused; the unix socket serves its owner', async () => {
  const none = await request({ body: INIT, auth: false });
  assert.equal(none.status, 401);
  const wrong = await request({ body: INIT, auth: false, headers: { Authorization: 'Bearer ' + 'x'.repeat(48) } });
  assert.equal(wrong.status, 401);
  const origin = await request({ body: INIT, headers: { Origin: 'http://evil.example' } });
  assert.equal(origin.status, 403);

  const viaUnix = await request({ body: INIT, unix: true });
  assert.equal(viaUnix.status, 200, viaUnix.body);
  const sid = viaUnix.headers['mcp-session-id'];
  const list = await request({ unix: true, body: { jsonrpc: '2.0', id: 3, method: 'tools/list' }, headers: { 'Mcp-Session-Id': sid } });
  assert.equal(list.json().result.tools.length, SESSION_TOOLS.length);
  assert.equal((await request({ method: 'DELETE', unix: true, headers: { 'Mcp-Session-Id': sid } })).status, 204);
});
