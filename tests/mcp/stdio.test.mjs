// agentbox mcp over stdio, driven by the official MCP TypeScript SDK client.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

import Ajv from 'ajv';
import { McpError } from '@modelcontextprotocol/sdk/types.js';

import { makeSandboxDirs, connectStdio, ALLOWED_HOST, SESSION_TOOLS, CODE_LANGUAGES } from './lib.mjs';

let dirs;
let conn;
let tools;

before(async () => {
  dirs = makeSandboxDirs();
  conn = await connectStdio(dirs);
  tools = (await conn.client.listTools()).tools;
});

after(async () => {
  if (conn) await conn.client.close();
  if (dirs) dirs.cleanup();
});

function text(result) {
  assert.equal(result.content.length, 1, JSON.stringify(result));
  assert.equal(result.content[0].type, 'text');
  return result.content[0].text;
}

async function call(name, args, options) {
  return conn.client.callTool({ name, arguments: args }, undefined, options);
}

test('initialize negotiates the current revision and names the server', () => {
  const version = conn.client.getServerVersion();
  assert.equal(version.name, 'agentbox');
  assert.ok(conn.client.getServerCapabilities().tools, 'tools capability');
  assert.match(conn.client.getInstructions() ?? '', /sandbox_denied/);
});

test('tools/list has every session tool with a description for a model', () => {
  assert.deepEqual(tools.map((t) => t.name), SESSION_TOOLS);
  for (const t of tools) {
    assert.ok(t.description.length > 100, `${t.name}: description too short`);
    assert.equal(t.inputSchema.type, 'object');
    assert.equal(t.inputSchema.additionalProperties, false, `${t.name}: inputSchema is not closed`);
  }
  const bash = tools.find((t) => t.name === 'bash');
  assert.deepEqual(bash.inputSchema.required, ['command']);
  assert.match(bash.description, /sandbox_denied/);
  assert.match(bash.description, /timed_out after/);
  assert.match(bash.description, /not a bug/);
});

// A valid value for each required field of the session's tools.
const SAMPLE = { command: 'true', path: 'sample.txt', content: 'x\n', old: 'x', new: 'y', pattern: '*.txt',
  offer_id: 'esc-000000000000', reason: 'a sample', language: CODE_LANGUAGES[0], code: '1' };

test('every schema compiles (ajv, strict) and the server agrees with it on bad arguments', async () => {
  const ajv = new Ajv({ strict: true, allErrors: true });
  for (const t of tools) {
    const validIn = ajv.compile(t.inputSchema);
    ajv.compile(t.outputSchema);
    // An unknown field is invalid to the schema and to the server.
    const bad = { no_such_field: 1 };
    for (const r of t.inputSchema.required ?? []) bad[r] = SAMPLE[r];
    assert.equal(validIn(bad), false, `${t.name}: schema accepts an unknown field`);
    await assert.rejects(call(t.name, bad), (e) => e instanceof McpError && e.code === -32602 && /no_such_field/.test(e.message));
    // A missing required field likewise.
    if ((t.inputSchema.required ?? []).length > 0) {
      assert.equal(validIn({}), false);
      await assert.rejects(call(t.name, {}), (e) => e.code === -32602 && /required/.test(e.message));
    }
  }
  await assert.rejects(call('bash', { command: 'true', timeout: 'soon' }), (e) => e.code === -32602 && /timeout/.test(e.message));
  await assert.rejects(call('no_such_tool', {}), (e) => e.code === -32602 && /unknown tool/.test(e.message));
  // request_escalation takes only an offer id as the report writes them.
  await assert.rejects(call('request_escalation', { offer_id: 'esc-XYZ', reason: 'needed' }),
    (e) => e.code === -32602 && /offer_id: does not match/.test(e.message));
});

// What each schema declares optional the server takes absent; what it
// requires, it requires; undeclared fields are refused (above).
test('every tool runs with its required fields alone, and optional ones are accepted', async () => {
  const optional = {
    bash: { timeout: 30, stdin: '', cwd: '.', env: { SAMPLE: '1' } },
    read_file: { offset: 1, limit: 1 },
    list_dir: { path: '.' },
    run_code: { timeout: 30 },
  };
  for (const t of tools) {
    const args = {};
    for (const r of t.inputSchema.required ?? []) {
      assert.ok(r in SAMPLE, `${t.name}.${r}: no sample value`);
      args[r] = SAMPLE[r];
    }
    if (t.name === 'edit_file') await call('write_file', { path: 'sample.txt', content: 'x\n' });
    const r = await call(t.name, args);
    assert.ok(r.content.length >= 1, `${t.name} with ${JSON.stringify(args)}: ${JSON.stringify(r)}`);
    for (const [field, value] of Object.entries(optional[t.name] ?? {})) {
      assert.ok(field in t.inputSchema.properties, `${t.name}.${field} is not declared`);
      const o = await call(t.name, { ...args, [field]: value });
      assert.ok(o.content.length >= 1, `${t.name}.${field}: ${JSON.stringify(o)}`);
    }
  }
  const listed = await call('list_dir', {});
  assert.equal(listed.isError, false, text(listed));
  assert.match(text(listed), /sample\.txt/);
});

test('bash takes a cwd inside the workspace and an env of its own', async () => {
  await call('bash', { command: 'mkdir -p ctx/inner' });
  const r = await call('bash', { command: 'pwd; echo "$CALL_VAR"', cwd: 'ctx/inner', env: { CALL_VAR: 'from the call' } });
  assert.equal(r.isError, false, text(r));
  assert.match(text(r), /\/ctx\/inner\nfrom the call\n$/);
  await assert.rejects(call('bash', { command: 'pwd', cwd: '..' }), (e) => e.code === -32602 && /cwd \.\./.test(e.message));
  await assert.rejects(call('bash', { command: 'env', env: { HTTPS_PROXY: 'http://127.0.0.1:1' } }),
    (e) => e.code === -32602 && /HTTPS_PROXY/.test(e.message));
  await assert.rejects(call('bash', { command: 'env', env: { '1BAD': 'x' } }), (e) => e.code === -32602 && /1BAD/.test(e.message));
});

test('each tool works, and the file tools and the shell see one workspace', async () => {
  const mk = await call('bash', { command: 'mkdir -p notes' });
  assert.equal(mk.isError, false, text(mk));
  const w = await call('write_file', { path: 'notes/a.txt', content: 'alpha\nbeta\n' });
  assert.equal(w.isError, false, text(w));

  const viaShell = await call('bash', { command: 'cat notes/a.txt' });
  assert.equal(viaShell.isError, false, text(viaShell));
  assert.equal(text(viaShell), 'alpha\nbeta\n');
  assert.equal(viaShell.structuredContent.kind, 'exited');
  assert.equal(viaShell.structuredContent.exit_code, 0);

  const e = await call('edit_file', { path: 'notes/a.txt', old: 'beta', new: 'gamma' });
  assert.equal(e.isError, false, text(e));
  const r = await call('read_file', { path: 'notes/a.txt' });
  assert.match(text(r), /alpha\s+(\d+\s+)?gamma|alpha\ngamma/);

  const s = await call('bash', { command: 'echo from-shell > notes/b.txt' });
  assert.equal(s.isError, false, text(s));
  const rb = await call('read_file', { path: 'notes/b.txt' });
  assert.match(text(rb), /from-shell/);

  const ls = await call('list_dir', { path: 'notes' });
  assert.match(text(ls), /a\.txt/);
  assert.match(text(ls), /b\.txt/);

  const g = await call('glob', { pattern: 'notes/*.txt' });
  assert.match(text(g), /notes\/a\.txt/);
  assert.match(text(g), /notes\/b\.txt/);

  const d = await call('diff', {});
  assert.equal(d.isError, false);
  const changed = d.structuredContent.files.map((f) => f.path);
  assert.ok(changed.some((p) => p.endsWith('notes/a.txt')), JSON.stringify(d.structuredContent));
  assert.match(d.structuredContent.patch, /\+gamma/);

  const snap = await call('snapshot', {});
  assert.equal(snap.isError, false, text(snap));
  assert.equal(typeof snap.structuredContent.snapshot_id, 'string');
  assert.ok(snap.structuredContent.snapshot_id.length > 0);

  // The base workspace is untouched until the user applies the diff.
  assert.equal(fs.existsSync(path.join(dirs.workspace, 'notes')), false);
});

test('a failing command is isError with its exit code first', async () => {
  const r = await call('bash', { command: 'echo oops >&2; exit 3' });
  assert.equal(r.isError, true);
  assert.match(text(r), /^exited with code 3\n/);
  assert.match(text(r), /oops/);
  assert.equal(r.structuredContent.exit_code, 3);
});

test('a missing file is a tool_error result, not a protocol error', async () => {
  const r = await call('read_file', { path: 'does/not/exist.txt' });
  assert.equal(r.isError, true);
  assert.match(text(r), /^tool_error/);
  assert.match(text(r), /exist\.txt/);
});

test('a write to a protected path is a denial with the kind first', async () => {
  const viaTool = await call('write_file', { path: '.git/config', content: '[core]\n' });
  assert.equal(viaTool.isError, true);
  assert.match(text(viaTool), /^sandbox_denied: /);
  assert.match(text(viaTool), /\.git\/config/);
  assert.equal(viaTool.structuredContent.kind, 'sandbox_denied');

  const viaShell = await call('bash', { command: 'echo "[x]" >> .git/config' });
  assert.equal(viaShell.isError, true);
  assert.match(text(viaShell), /^sandbox_denied: /);
  assert.match(text(viaShell), /\.git\/config/);
});

test('network egress to a host the policy does not allow is a proxy denial', async () => {
  const r = await call('bash', { command: 'curl -sS --max-time 20 https://evil.example/' });
  assert.equal(r.isError, true, text(r));
  assert.match(text(r), /^sandbox_denied: network egress to evil\.example:443 /);
  const denials = r.structuredContent.outcome.denials;
  assert.ok(denials.some((d) => d.facet === 'network' && d.target === 'evil.example:443' && d.source === 'proxy'),
    JSON.stringify(denials));
  assert.ok(!text(r).includes(ALLOWED_HOST));
});

test('a command past its timeout is timed_out first', async () => {
  const r = await call('bash', { command: 'sleep 20', timeout: 1 });
  assert.equal(r.isError, true);
  assert.match(text(r), /^timed_out after 1(\.0)?s\n/);
  assert.equal(r.structuredContent.kind, 'timed_out');
});

test('long output is capped with an explicit note', async () => {
  const r = await call('bash', { command: 'head -c 300000 /dev/zero | tr "\\0" x' });
  assert.ok(Buffer.byteLength(text(r)) < 80 * 1024, `${Buffer.byteLength(text(r))} bytes`);
  assert.match(text(r), /truncat/i);
  assert.equal(r.structuredContent.truncated, true);
});

test('progress notifications come for a long command when asked for', async () => {
  const seen = [];
  const r = await call('bash', { command: 'for i in 1 2 3; do echo step $i; sleep 1; done' },
    { onprogress: (p) => seen.push(p), resetTimeoutOnProgress: true });
  assert.equal(r.isError, false, text(r));
  assert.ok(seen.length >= 1, 'no progress notification');
  for (let i = 1; i < seen.length; i++) assert.ok(seen[i].progress > seen[i - 1].progress);
  assert.ok(seen.some((p) => /step/.test(p.message ?? '')), JSON.stringify(seen));
  // The messages carry the output itself, in order, each byte once.
  assert.equal(seen.map((p) => p.message ?? '').join(''), 'step 1\nstep 2\nstep 3\n', JSON.stringify(seen));
  assert.equal(text(r), 'step 1\nstep 2\nstep 3\n');
});

test('a cancelled bash call stops running', async () => {
  const controller = new AbortController();
  const from = conn.log.mark();
  const pending = call('bash', { command: 'echo started; sleep 30' }, { signal: controller.signal });
  const started = await conn.log.waitFor(/tools\/call (\S+) bash\n/, { from });
  const id = started[1];
  controller.abort('test cancels');
  await assert.rejects(pending);
  // The server records the call as cancelled (a natural end would say exited).
  await conn.log.waitFor(new RegExp(`tools/call ${id} bash: cancelled`), { from });
  // And nothing of it is left in the sandbox.
  const ps = await call('bash', {
    command: 'for p in /proc/[0-9]*; do tr "\\0" " " 2>/dev/null < $p/cmdline; echo; done | grep -c "^sleep 30" || true',
  });
  assert.equal(text(ps).trim(), '0');
  // The session goes on.
  const ping = await conn.client.ping();
  assert.deepEqual(ping, {});
});
