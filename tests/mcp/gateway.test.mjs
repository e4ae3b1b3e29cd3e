// The tool gateway (policy tools.upstream): `agentbox mcp` offers an
// upstream MCP server's allowed tools as tracker.TOOL next to its own. The
// upstream (upstream_tracker.mjs, on the official SDK's Server class) is
// started by agentbox outside the sandbox and gets the token; the sandbox
// never sees it. Driven by the official SDK client over stdio.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { McpError } from '@modelcontextprotocol/sdk/types.js';

import { connectStdio, makeSandboxDirs, jsonLines, toolText } from './lib.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const TOKEN_VAR = 'AGENTBOX_TRACKER_TOKEN';
const token = `trk-${crypto.randomBytes(16).toString('hex')}`;

let dirs, client, transport, log, upstreamLog;

before(async () => {
  dirs = makeSandboxDirs();
  upstreamLog = path.join(dirs.root, 'upstream.jsonl');
  fs.writeFileSync(dirs.policy, `version: 1
mode: workspace-write
network:
  default: deny
  egress_proxy: true
  allow: ["allowed.example"]
credentials:
  secrets:
    tracker_token:
      from: { env: ${TOKEN_VAR} }
tools:
  upstream:
    - name: tracker
      command: [node, ${JSON.stringify(path.join(here, 'upstream_tracker.mjs'))}, ${JSON.stringify(upstreamLog)}]
      secret: tracker_token
      allow: [search_issues, get_issue, slow, crash]
      timeout: 2s
`);
  ({ client, transport, log } = await connectStdio(dirs, [], { [TOKEN_VAR]: token }));
});

after(async () => {
  if (client) await client.close();
  if (dirs) dirs.cleanup();
});

const upstreamCalls = () => jsonLines(upstreamLog);
const text = toolText;

test('the allowed upstream tools are listed next to the session\'s own, with their schemas; the others do not exist', async () => {
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name);
  assert.ok(names.includes('bash'), names.join(', '));
  for (const n of ['tracker.search_issues', 'tracker.get_issue', 'tracker.slow', 'tracker.crash']) {
    assert.ok(names.includes(n), `${n} missing from ${names.join(', ')}`);
  }
  assert.ok(!names.includes('tracker.delete_everything'), 'a tool the policy does not allow is listed');
  const search = tools.find((t) => t.name === 'tracker.search_issues');
  assert.equal(search.description, 'Search issues by a word in their title.');
  assert.deepEqual(search.inputSchema.required, ['query']);
});

test('50 calls reach the upstream, each with the token; the results come back as the upstream gave them', async () => {
  const before = upstreamCalls().length;
  let open = 0;
  for (let i = 0; i < 50; ++i) {
    const r = await client.callTool({ name: 'tracker.search_issues', arguments: { query: 'crash', limit: 3 } });
    assert.equal(r.isError, false, text(r));
    const issues = JSON.parse(text(r));
    assert.equal(issues.length, 3);
    assert.deepEqual(r.structuredContent, { issues });
    open += issues.filter((x) => x.state === 'open').length;
  }
  assert.ok(open > 0);
  const calls = upstreamCalls().slice(before);
  assert.equal(calls.length, 50);
  for (const c of calls) {
    assert.equal(c.tool, 'search_issues');
    assert.equal(c.token, token, 'the upstream did not get the token');
  }
  assert.equal(new Set(calls.map((c) => c.pid)).size, 1, 'one upstream process served them all');
});

test('the sandbox never sees the token: not in its environment, its files or /proc, and not the upstream\'s process', async () => {
  await client.callTool({ name: 'tracker.get_issue', arguments: { id: 1 } });
  const pid = upstreamCalls().at(-1).pid;
  const r = await client.callTool({
    name: 'bash',
    arguments: {
      command: `env; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < "$f"; done 2>/dev/null; ` +
        `cat /proc/${pid}/environ 2>&1; grep -rlsE 'trk-[0-9a-f]{32}' . /tmp /etc /run /dev/shm "$HOME" 2>/dev/null | sed 's/^/HOLDS-A-TOKEN: /'; echo done`,
    },
  });
  // (The command names no token: a file with one would be listed by the pattern.)
  const out = text(r);
  assert.match(out, /done/);
  assert.doesNotMatch(out, /^HOLDS-A-TOKEN: /m, `a file in the sandbox holds a token:\n${out}`);
  assert.ok(!out.includes(token), `the token is visible in the sandbox:\n${out}`);
  assert.doesNotMatch(out, new RegExp(`^${TOKEN_VAR}=`, 'm'));
  assert.ok(!JSON.stringify(r).includes(token));
  assert.ok(!log.text.includes(token), 'the token is in the server\'s log');
  // agentbox's own environment no longer holds it either.
  const environ = fs.readFileSync(`/proc/${transport.pid}/environ`, 'latin1');
  assert.ok(!environ.includes(token), 'agentbox\'s /proc/PID/environ still holds the token');
});

test('a tool that is not allowed, and input its schema refuses, never reach the upstream', async () => {
  const before = upstreamCalls().length;
  await assert.rejects(client.callTool({ name: 'tracker.delete_everything', arguments: {} }),
    (e) => e instanceof McpError && e.code === -32602 && /unknown tool/.test(e.message));
  await assert.rejects(client.callTool({ name: 'tracker.search_issues', arguments: { query: 5 } }),
    (e) => e instanceof McpError && e.code === -32602 && /query: expected string, got integer/.test(e.message));
  await assert.rejects(client.callTool({ name: 'tracker.search_issues', arguments: {} }),
    (e) => e instanceof McpError && e.code === -32602 && /query: required/.test(e.message));
  assert.equal(upstreamCalls().length, before, 'a refused call reached the upstream');
});

test('a slow upstream is bounded by its timeout, a crashed one is named and started again', async () => {
  const slow = await client.callTool({ name: 'tracker.slow', arguments: {} });
  assert.equal(slow.isError, true);
  assert.match(text(slow), /^tool_error: upstream tracker did not answer tools\/call within 2 s/);
  const crash = await client.callTool({ name: 'tracker.crash', arguments: {} });
  assert.equal(crash.isError, true);
  assert.match(text(crash), /^tool_error: upstream tracker is gone \(.*exit.* 3.*\).*crashing on purpose/s);
  const pidBefore = upstreamCalls().at(-1).pid;
  const again = await client.callTool({ name: 'tracker.get_issue', arguments: { id: 2 } });
  assert.equal(again.isError, false, text(again));
  assert.equal(JSON.parse(text(again)).id, 2);
  assert.notEqual(upstreamCalls().at(-1).pid, pidBefore, 'a new upstream process');
  // An upstream's own error is the tool's error, passed on.
  const missing = await client.callTool({ name: 'tracker.get_issue', arguments: { id: 999 } });
  assert.equal(missing.isError, true);
  assert.match(text(missing), /no issue 999/);
});

test('upstream calls are in the session log, a refused one too', async () => {
  const sessions = path.join(dirs.stateDir, 'sessions');
  const ids = fs.readdirSync(sessions);
  assert.equal(ids.length, 1);
  const lines = fs.readFileSync(path.join(sessions, ids[0], 'log.jsonl'), 'utf8').split('\n').filter(Boolean)
    .map((l) => JSON.parse(l));
  const calls = lines.filter((l) => l.type === 'call' && l.name === 'tracker.search_issues');
  assert.ok(calls.length >= 50, `${calls.length} calls logged`);
  const results = lines.filter((l) => l.type === 'result' && l.result.name === 'tracker.search_issues');
  assert.ok(results.length >= 50);
  assert.ok(results.every((l) => typeof l.result.duration_ms === 'number' && l.result.output_bytes > 0));
  const refused = lines.filter((l) => l.type === 'event' && l.event === 'upstream_refused');
  assert.ok(refused.some((l) => /query/.test(l.why)), JSON.stringify(refused));
});

test('run_code is listed with its bindings, and a program calls the upstream tool as a function without ever holding the token', async (t) => {
  const { tools } = await client.listTools();
  const runCode = tools.find((x) => x.name === 'run_code');
  if (!runCode) {
    assert.ok(!fs.existsSync('/usr/bin/python3') && !fs.existsSync('/usr/bin/node'),
      'run_code is missing although the host has an interpreter');
    t.skip('not applicable here: neither python3 nor node is on the read-only system');
    return;
  }
  for (const b of ['tools.read_file(path, limit?, offset?)', 'tools.tracker.search_issues(query', 'tools.glob(pattern)']) {
    assert.ok(runCode.description.includes(b), `${b} is not in run_code's description:\n${runCode.description}`);
  }
  assert.ok(!runCode.description.includes('tools.bash('), 'bash is bound without tools.run_code.bash');
  const language = fs.existsSync('/usr/bin/python3') ? 'python' : 'javascript';
  const code = language === 'python'
    ? "import os, tools\nfound = await tools.tracker.search_issues(query='crash', limit=2)\n" +
      "{'ids': [i['id'] for i in found['issues']], 'env': sorted(k for k in os.environ if 'TOKEN' in k)}\n"
    : "const found = await tools.tracker.search_issues({query: 'crash', limit: 2});\n" +
      "return {ids: found.issues.map((i) => i.id), env: Object.keys(process.env).filter((k) => k.includes('TOKEN')).sort()};\n";
  const before = upstreamCalls().length;
  const r = await client.callTool({ name: 'run_code', arguments: { language, code } });
  assert.equal(r.isError, false, text(r));
  assert.equal(r.structuredContent.result.ids.length, 2, JSON.stringify(r.structuredContent));
  assert.deepEqual(r.structuredContent.result.env, [], 'the program sees a token variable');
  assert.ok(!JSON.stringify(r).includes(token));
  const calls = upstreamCalls().slice(before);
  assert.equal(calls.length, 1);
  assert.equal(calls[0].token, token, 'the upstream did not get the token');
});
