// agentbox mcp at the JSON-RPC level, over raw stdio: each bad message gets
// the right error, and the server still answers ping afterwards.
import { test, beforeEach, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

import { makeSandboxDirs, RawServer, SESSION_TOOLS } from './lib.mjs';

let dirs;
let server;

beforeEach(() => {
  dirs = makeSandboxDirs();
  server = new RawServer(dirs);
});

afterEach(async () => {
  try {
    if (server) {
      server.child.stdin.end();
      const t = setTimeout(() => server.child.kill('SIGKILL'), 30000);
      await server.exited;
      clearTimeout(t);
    }
  } finally {
    dirs.cleanup();
  }
});

async function assertPing(id) {
  await server.request(id, 'ping');
  const r = await server.response(id);
  assert.deepEqual(r, { jsonrpc: '2.0', id, result: {} });
}

test('a request before initialize is refused (-32002); ping is answered', async () => {
  await server.request(5, 'tools/list');
  const r = await server.response(5);
  assert.equal(r.error.code, -32002);
  assert.match(r.error.message, /not initialized/);
  await assertPing(6);
  const init = await server.initialize();
  assert.equal(init.result.protocolVersion, '2025-06-18');
  await server.request(7, 'tools/list');
  assert.equal((await server.response(7)).result.tools.length, SESSION_TOOLS.length);
});

test('initialize answers a supported older revision, and the latest for an unknown one', async () => {
  const init = await server.initialize('2024-11-05');
  assert.equal(init.result.protocolVersion, '2024-11-05');
  // A state directory serves one process at a time: the second server gets its own.
  const again = new RawServer({ ...dirs, stateDir: dirs.stateDir + '-2' });
  try {
    const r = await again.initialize('1999-12-31');
    assert.equal(r.result.protocolVersion, '2025-06-18');
  } finally {
    await again.close();
  }
});

test('a bad policy file stops the server before any protocol, naming the file', async () => {
  const bad = dirs.policy.replace(/policy\.yaml$/, 'bad.yaml');
  fs.writeFileSync(bad, 'version: 1\nmode: bogus\n');
  const broken = new RawServer({ ...dirs, policy: bad, stateDir: dirs.stateDir + '-bad' });
  const end = await broken.exited;
  assert.equal(end.code, 2);
  assert.match(broken.log.text, /bad\.yaml/);
  assert.match(broken.log.text, /bogus/);
  assert.equal(broken.stdoutText, '');
  assert.equal(broken.lines.length, 0);
});

test('with fresh_per_task: false the session edits the workspace itself, and has no diff', async () => {
  const direct = dirs.policy.replace(/policy\.yaml$/, 'direct.yaml');
  fs.writeFileSync(direct, 'version: 1\nsandbox:\n  fresh_per_task: false\n');
  const srv = new RawServer({ ...dirs, policy: direct, stateDir: dirs.stateDir + '-direct' });
  try {
    await srv.initialize();
    await srv.request(2, 'tools/call', { name: 'write_file', arguments: { path: 'direct.txt', content: 'in place\n' } });
    assert.equal((await srv.response(2)).result.isError, false);
    assert.equal(fs.readFileSync(path.join(dirs.workspace, 'direct.txt'), 'utf8'), 'in place\n');
    await srv.request(3, 'tools/call', { name: 'diff', arguments: {} });
    const d = await srv.response(3);
    assert.equal(d.result.isError, true);
    assert.match(d.result.content[0].text, /^tool_error: .*works on its workspace directly/);
    assert.equal(d.result.structuredContent, undefined);
  } finally {
    await srv.close();
  }
});

test('malformed JSON is a parse error (-32700) with a null id', async () => {
  await server.initialize();
  await server.send('{"jsonrpc": "2.0", "id": 3, "method": "ping"');
  const r = await server.next((m) => m.error?.code === -32700);
  assert.equal(r.id, null);
  assert.match(r.error.message, /not valid JSON/);
  await assertPing(4);
});

test('an unknown method is -32601', async () => {
  await server.initialize();
  await server.request(8, 'resources/list');
  const r = await server.response(8);
  assert.equal(r.error.code, -32601);
  assert.match(r.error.message, /resources\/list/);
  await assertPing(9);
});

test('bad params are -32602 naming the field', async () => {
  await server.initialize();
  const cases = [
    [{ name: 'bash', arguments: {} }, /arguments\.command: required/],
    [{ name: 'bash', arguments: { command: 42 } }, /arguments\.command: expected string/],
    [{ name: 'read_file', arguments: { path: 'a', offset: -1 } }, /arguments\.offset: must be at least 1/],
    [{ name: 'write_file', arguments: { path: 'a', content: 'x', mode: 'w' } }, /arguments\.mode: unknown field/],
    [{ name: 'rm_rf', arguments: {} }, /unknown tool "rm_rf"/],
    [{ arguments: {} }, /params\.name/],
  ];
  let id = 20;
  for (const [params, re] of cases) {
    await server.request(++id, 'tools/call', params);
    const r = await server.response(id);
    assert.equal(r.error?.code, -32602, JSON.stringify(r));
    assert.match(r.error.message, re);
  }
  await server.request(++id, 'initialize', { capabilities: {} });
  assert.equal((await server.response(id)).error.code, -32600);  // already initialized
  await assertPing(++id);
});

test('invalid requests are -32600', async () => {
  await server.initialize();
  await server.send('[1, 2]');  // a batch under 2025-06-18
  let r = await server.next((m) => m.error?.code === -32600);
  assert.match(r.error.message, /batches are not supported in protocol revision 2025-06-18/);
  await server.send('{"jsonrpc": "1.0", "id": 31, "method": "ping"}');
  r = await server.response(31);
  assert.equal(r.error.code, -32600);
  await server.send('"just a string"');
  r = await server.next((m) => m.error?.code === -32600);
  assert.equal(r.id, null);
  await assertPing(32);
});

test('a 10 MiB line is answered with an error and the server goes on', async () => {
  await server.initialize();
  const huge = JSON.stringify({ jsonrpc: '2.0', id: 40, method: 'tools/call',
    params: { name: 'write_file', arguments: { path: 'big.txt', content: 'x'.repeat(10 * 1024 * 1024) } } });
  await server.send(huge);
  const r = await server.next((m) => m.error?.code === -32600);
  assert.equal(r.id, null);
  assert.match(r.error.message, /exceeds the limit/);
  await assertPing(41);
  // Nothing was written.
  await server.request(42, 'tools/call', { name: 'bash', arguments: { command: 'test -e big.txt && echo yes || echo no' } });
  const check = await server.response(42);
  assert.equal(check.result.content[0].text.trim(), 'no');
});

test('nothing but protocol on stdout, and EOF shuts down cleanly', async () => {
  await server.initialize();
  await server.request(50, 'tools/call', { name: 'bash', arguments: { command: 'echo to-stdout; echo to-stderr >&2' } });
  const r = await server.response(50);
  assert.equal(r.result.isError, false);
  const end = await server.close();
  assert.deepEqual(end, { code: 0, signal: null });
  assert.equal(server.stdoutText, '');           // no partial line left
  for (const line of server.lines) JSON.parse(line);  // every other line is JSON-RPC
  assert.match(server.log.text, /stdin closed; shut down/);
  server = null;
});

test('a ping is answered while a long call runs, and cancellation ends the call without a response', async () => {
  await server.initialize();
  await server.request(60, 'tools/call', { name: 'bash', arguments: { command: 'sleep 30; echo done' } });
  await server.log.waitFor(/tools\/call 60 bash\n/);
  await assertPing(61);
  // The ping came back while the call was still running.
  assert.ok(!server.lines.some((l) => JSON.parse(l).id === 60));
  await server.send(JSON.stringify({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 60, reason: 'test' } }));
  await server.log.waitFor(/tools\/call 60 bash: cancelled/);
  await assertPing(62);
  assert.ok(!server.lines.some((l) => JSON.parse(l).id === 60), 'a cancelled request got a response');
});
