// The tool gateway with Streamable HTTP upstreams (policy tools.upstream
// with `url`): the test tracker (upstream_tracker.mjs --http, on the
// official SDK's Server and StreamableHTTPServerTransport) listens on
// 127.0.0.1 and wants a bearer token; agentbox holds the token and sends it
// on each request; the sandbox, and a run_code program, never see it and
// cannot reach the tracker themselves. Driven by the official SDK client.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';


import { CODE_LANGUAGES, connectStdio, makeSandboxDirs, jsonLines, toolText } from './lib.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const TOKEN_VAR = 'AGENTBOX_TRACKER_TOKEN';
const WRONG_VAR = 'AGENTBOX_WRONG_TOKEN';
const token = `trk-${crypto.randomBytes(16).toString('hex')}`;

let dirs, client, transport, log, upstreamLog, port, securePort, strangerPort;
const upstreams = [];

async function waitForFile(file, ms) {
  const until = Date.now() + ms;
  while (!fs.existsSync(file)) {
    if (Date.now() > until) throw new Error(`${file} did not appear within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
  return fs.readFileSync(file, 'utf8');
}

before(async () => {
  dirs = makeSandboxDirs();
  upstreamLog = path.join(dirs.root, 'upstream.jsonl');
  const portFile = path.join(dirs.root, 'upstream.port');
  // The https trackers: one with a certificate for 127.0.0.1 that the
  // daemon trusts (SSL_CERT_FILE), one with a certificate it does not.
  const cert = (name) => {
    const c = path.join(dirs.root, `${name}.crt`), k = path.join(dirs.root, `${name}.key`);
    execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '1',
      '-subj', `/CN=${name}`, '-addext', 'subjectAltName=IP:127.0.0.1', '-keyout', k, '-out', c], { stdio: 'ignore' });
    return [c, k];
  };
  const start = async (name, ...tls) => {
    const portFile = path.join(dirs.root, `${name}.port`);
    upstreams.push(spawn(process.execPath, [path.join(here, 'upstream_tracker.mjs'), upstreamLog, '--http', portFile, ...tls],
      { env: { ...process.env, TRACKER_EXPECT_TOKEN: token }, stdio: ['ignore', 'ignore', 'inherit'] }));
    return Number(await waitForFile(portFile, 10000));
  };
  const trusted = cert('trusted');
  port = await start('plain');
  securePort = await start('secure', ...trusted);
  strangerPort = await start('stranger', ...cert('stranger'));
  fs.writeFileSync(dirs.policy, `version: 1
mode: workspace-write
network:
  default: deny
  egress_proxy: true
  allow: ["127.0.0.1"]
credentials:
  secrets:
    tracker_token:
      from: { env: ${TOKEN_VAR} }
    wrong_token:
      from: { env: ${WRONG_VAR} }
tools:
  upstream:
    - name: tracker
      url: "http://127.0.0.1:${port}/mcp"
      secret: tracker_token
      allow: [search_issues, get_issue, slow]
      timeout: 2s
    - name: trackerjson
      url: "http://127.0.0.1:${port}/mcp-json"
      secret: tracker_token
      allow: [search_issues]
    - name: intruder
      url: "http://127.0.0.1:${port}/mcp"
      secret: wrong_token
      allow: [search_issues]
    - name: secure
      url: "https://127.0.0.1:${securePort}/mcp"
      secret: tracker_token
      allow: [search_issues]
    - name: stranger
      url: "https://127.0.0.1:${strangerPort}/mcp"
      secret: tracker_token
      allow: [search_issues]
    - name: moved
      url: "http://127.0.0.1:${port}/moved"
      secret: tracker_token
      allow: [search_issues]
`);
  ({ client, transport, log } = await connectStdio(dirs, [], { [TOKEN_VAR]: token, [WRONG_VAR]: 'not-the-token', SSL_CERT_FILE: trusted[0] }));
});

after(async () => {
  if (client) await client.close();
  for (const u of upstreams) u.kill('SIGKILL');
  if (dirs) dirs.cleanup();
});

const upstreamCalls = () => jsonLines(upstreamLog);
const text = toolText;

test('an HTTP upstream\'s allowed tools are listed; one that refuses the credential lists none', async () => {
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name);
  for (const n of ['tracker.search_issues', 'tracker.get_issue', 'tracker.slow', 'trackerjson.search_issues']) {
    assert.ok(names.includes(n), `${n} missing from ${names.join(', ')}`);
  }
  assert.ok(!names.some((n) => n.startsWith('intruder.')), names.join(', '));
  assert.ok(!names.includes('tracker.delete_everything'));
  await assert.rejects(client.callTool({ name: 'intruder.search_issues', arguments: { query: 'crash' } }),
    (e) => e.code === -32602 && /unknown tool "intruder\.search_issues".*upstream intruder \(http:\/\/127\.0\.0\.1:\d+\) refused the credential for initialize \(HTTP 401, WWW-Authenticate: Bearer realm="tracker"\)/.test(e.message));
});

test('calls answered as an event stream and as JSON both come back; each request carried the token', async () => {
  const before = upstreamCalls().length;
  for (const name of ['tracker.search_issues', 'trackerjson.search_issues']) {
    const r = await client.callTool({ name, arguments: { query: 'crash', limit: 2 } });
    assert.equal(r.isError, false, text(r));
    const issues = JSON.parse(text(r));
    assert.equal(issues.length, 2);
    assert.deepEqual(r.structuredContent, { issues });
  }
  const calls = upstreamCalls().slice(before);
  assert.deepEqual(calls.map((c) => new URL(c.path).pathname), ['/mcp', '/mcp-json']);
  for (const c of calls) assert.equal(c.token, token, 'the upstream did not get the token');
  assert.ok(!log.text.includes(token), 'the token is in the server\'s log');
});

test('a run_code program calls tracker.search_issues 50 times and returns 3 lines; it finds no token and cannot reach the tracker', async (t) => {
  if (!CODE_LANGUAGES.includes('python')) {
    t.skip('not applicable here: no python3 on the read-only system');
    return;
  }
  // The program names no token: it looks for anything shaped like one.
  const code = `import glob, os, re, urllib.request, tools
ids, open_ = set(), 0
for i in range(50):
    found = await tools.tracker.search_issues(query='crash' if i % 2 else 'slowness', limit=3)
    ids.update(x['id'] for x in found['issues'])
    open_ += sum(x['state'] == 'open' for x in found['issues'])
try:
    urllib.request.urlopen('http://127.0.0.1:${port}/mcp', timeout=3)
    direct = 'reached the tracker'
except Exception as e:
    direct = 'refused: ' + str(e)
shape = re.compile(rb'trk-[0-9a-f]{32}')
seen = [k for k, v in os.environ.items() if shape.search(v.encode())]
for p in glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline'):
    try:
        if shape.search(open(p, 'rb').read()): seen.append(p)
    except OSError:
        pass
for root in ['.', '/tmp', os.path.expanduser('~')]:
    for d, _, files in os.walk(root):
        for f in files:
            try:
                if shape.search(open(os.path.join(d, f), 'rb').read(1 << 20)): seen.append(os.path.join(d, f))
            except OSError:
                pass
result(f"50 searches: {len(ids)} distinct issues, {open_} open hits\\ndirect: {direct}\\ntoken seen in: {seen or 'nothing'}")
`;
  const before = upstreamCalls().length;
  const r = await client.callTool({ name: 'run_code', arguments: { language: 'python', code, timeout: 60 } });
  assert.equal(r.isError, false, text(r));
  const lines = text(r).trim().split('\n');
  t.diagnostic(`the program's output:\n${text(r)}`);
  assert.equal(lines.length, 3, text(r));
  assert.match(lines[0], /^50 searches: \d+ distinct issues, \d+ open hits$/);
  assert.match(lines[1], new RegExp(`^direct: refused: .*run_code programs have no network: 127\\.0\\.0\\.1:${port} refused`), lines[1]);
  assert.equal(lines[2], 'token seen in: nothing');
  const calls = upstreamCalls().slice(before);
  assert.equal(calls.filter((c) => c.tool === 'search_issues').length, 50);
  assert.ok(calls.every((c) => c.token === token), 'a call reached the upstream without the token');
  assert.ok(!JSON.stringify(r).includes(token));
});

test('https is verified against the trust store, and a redirect is not followed with the credential', async () => {
  const before = upstreamCalls().length;
  const r = await client.callTool({ name: 'secure.search_issues', arguments: { query: 'crash', limit: 1 } });
  assert.equal(r.isError, false, text(r));
  assert.equal(JSON.parse(text(r)).length, 1);
  const calls = upstreamCalls().slice(before);
  assert.equal(calls.length, 1);
  assert.equal(calls[0].token, token);
  await assert.rejects(client.callTool({ name: 'stranger.search_issues', arguments: { query: 'crash' } }),
    (e) => e.code === -32602 && /upstream stranger \(https:\/\/127\.0\.0\.1:\d+\) cannot be reached: TLS: certificate verify failed/.test(e.message),
    'a server whose certificate the trust store does not hold was spoken to');
  await assert.rejects(client.callTool({ name: 'moved.search_issues', arguments: { query: 'crash' } }),
    (e) => e.code === -32602 && /upstream moved \(http:\/\/127\.0\.0\.1:\d+\) redirects initialize \(HTTP 307 to \/mcp\); a redirect is not followed/.test(e.message));
  assert.equal(upstreamCalls().length, before + 1);
});

test('a slow HTTP upstream is bounded by its timeout; a session the server ended is opened again', async () => {
  const slow = await client.callTool({ name: 'tracker.slow', arguments: {} });
  assert.equal(slow.isError, true);
  assert.match(text(slow), /^tool_error: upstream tracker did not answer tools\/call within 2 s/);
  const ended = await fetch(`http://127.0.0.1:${port}/end-sessions`, { method: 'POST' });
  assert.equal(ended.status, 204);
  const lost = await client.callTool({ name: 'tracker.get_issue', arguments: { id: 3 } });
  assert.equal(lost.isError, true);
  assert.match(text(lost), /upstream tracker ended its session \(HTTP 404 to tools\/call\); the next call starts a new one/);
  const again = await client.callTool({ name: 'tracker.get_issue', arguments: { id: 3 } });
  assert.equal(again.isError, false, text(again));
  assert.equal(JSON.parse(text(again)).id, 3);
});
