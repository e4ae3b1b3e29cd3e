// agentbox mcp with a policy that has credentials.secrets: the server reads
// the secret from its own environment and the session's sandbox sees only
// the placeholder (what the upstream then receives is tested over the
// daemon's API in tests/session/credentials_test.cc). Driven by the official
// MCP TypeScript SDK client over stdio.
import { test, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';

import { BIN, LineLog, makeSandboxDirs, serverArgs } from './lib.mjs';

const TOKEN_VAR = 'AGENTBOX_MCP_TEST_TOKEN';

const CREDENTIALS_POLICY = `version: 1
mode: workspace-write
network:
  allow: ["api.test"]
credentials:
  secrets:
    api:
      from: { env: ${TOKEN_VAR} }
      hosts: [api.test]
      inject: { header: Authorization, format: "Bearer {}" }
      placeholder_env: API_TOKEN_PLACEHOLDER
`;

let cleanups = [];
afterEach(async () => {
  for (const c of cleanups.reverse()) await c();
  cleanups = [];
});

// `agentbox mcp` on a policy with credentials, with `extraEnv` added to the
// server's environment (and nothing else of this process's but PATH, HOME, LANG, TMPDIR).
async function connect(extraEnv) {
  const dirs = makeSandboxDirs();
  cleanups.push(() => dirs.cleanup());
  fs.writeFileSync(dirs.policy, CREDENTIALS_POLICY);
  const env = { ...extraEnv };
  for (const k of ['PATH', 'HOME', 'LANG', 'TMPDIR']) if (process.env[k]) env[k] = process.env[k];
  const transport = new StdioClientTransport({
    command: BIN, args: serverArgs(dirs), env, stderr: 'pipe', cwd: dirs.root,
  });
  const log = new LineLog(transport.stderr);
  const client = new Client({ name: 'agentbox-mcp-credentials-test', version: '1.0.0' });
  await client.connect(transport);
  cleanups.push(() => client.close());
  return { client, transport, log };
}

function text(result) {
  assert.equal(result.content.length, 1, JSON.stringify(result));
  return result.content[0].text;
}

test('a policy with credentials is accepted; the sandbox sees the placeholder, never the value', async () => {
  const token = `tok-${crypto.randomBytes(16).toString('hex')}`;
  const { client, transport, log } = await connect({ [TOKEN_VAR]: token });
  const r = await client.callTool({ name: 'bash', arguments: { command: "env; tr '\\0' '\\n' < /proc/self/environ" } });
  const out = text(r);
  assert.equal(r.isError, false, out);
  assert.match(out, /^API_TOKEN_PLACEHOLDER=agentbox-placeholder-api-[0-9a-f]+$/m);
  assert.ok(!out.includes(token), `the value is inside the sandbox:\n${out}`);
  assert.doesNotMatch(out, new RegExp(`^${TOKEN_VAR}=`, 'm'));
  assert.ok(!JSON.stringify(r).includes(token), 'the value is in the tool result');
  // The server took the value out of its own environment once it read it.
  const environ = fs.readFileSync(`/proc/${transport.pid}/environ`, 'latin1');
  assert.ok(environ.includes('PATH='), 'the server\'s environment could not be read');
  assert.ok(!environ.includes(token), 'the server\'s /proc/PID/environ still holds the value');
  assert.ok(!log.text.includes(token), `the value is in the server's log:\n${log.text}`);
});

test('a secret whose source is missing fails the call by name, not the server', async () => {
  const { client } = await connect({});
  const r = await client.callTool({ name: 'bash', arguments: { command: 'echo ran' } });
  const out = text(r);
  assert.equal(r.isError, true, out);
  assert.match(out, /^sandbox_error: /);
  assert.match(out, new RegExp(`credentials\\.secrets\\.api \\(from env ${TOKEN_VAR}\\)`));
  assert.ok(!out.includes('ran\n'), out);
});
