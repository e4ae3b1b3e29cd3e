// Shared set-up for the MCP tests: a workspace with a policy, `agentbox mcp`
// behind the SDK's stdio client or as a raw child process, and clean-up.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';

export const BIN = process.env.AGENTBOX_BIN;
if (!BIN) throw new Error('AGENTBOX_BIN is not set (the agentbox binary under test)');

// The host name the policy allows; anything else is refused by the proxy.
export const ALLOWED_HOST = 'allowed.example';

// run_code's languages on this host, found where the server looks for them
// (python3 and node on the read-only system, /usr/bin or /bin).
const onSystem = (name) => ['/usr/bin/', '/bin/'].some((d) => fs.existsSync(d + name));
export const CODE_LANGUAGES = [...(onSystem('python3') ? ['python'] : []), ...(onSystem('node') ? ['javascript'] : [])];

// The session's own tools, in the order tools/list gives them; run_code only
// where the host has an interpreter for it.
export const SESSION_TOOLS = ['bash', 'read_file', 'write_file', 'edit_file', 'list_dir', 'glob', 'diff', 'snapshot',
  'request_escalation', ...(CODE_LANGUAGES.length > 0 ? ['run_code'] : [])];

export const POLICY = `version: 1
mode: workspace-write
filesystem:
  protect: [.git/config, .git/hooks]
network:
  default: deny
  egress_proxy: true
  allow: ["${ALLOWED_HOST}"]
`;

// A temporary directory with a git workspace, a policy and a state dir;
// `cleanup()` removes it all.
export function makeSandboxDirs() {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'agentbox-mcp-test-'));
  const workspace = path.join(root, 'ws');
  fs.mkdirSync(workspace);
  execFileSync('git', ['init', '-q', workspace]);
  fs.writeFileSync(path.join(workspace, 'README.txt'), 'base file\n');
  const policy = path.join(root, 'policy.yaml');
  fs.writeFileSync(policy, POLICY);
  const stateDir = path.join(root, 'state');
  return {
    root, workspace, policy, stateDir,
    cleanup() { fs.rmSync(root, { recursive: true, force: true }); },
  };
}

export function serverArgs(dirs, extra = []) {
  return ['mcp', '--workspace', dirs.workspace, '--policy', dirs.policy, '--state-dir', dirs.stateDir, ...extra];
}

function childEnv() {
  const env = {};
  for (const k of ['PATH', 'HOME', 'LANG', 'TMPDIR', 'USER', 'LOGNAME']) if (process.env[k]) env[k] = process.env[k];
  return env;
}

// Collects a child's stderr lines and lets a test wait for one.
export class LineLog {
  constructor(stream) {
    this.text = '';
    this.waiters = [];
    stream.setEncoding('utf8');
    stream.on('data', (chunk) => {
      this.text += chunk;
      this.waiters = this.waiters.filter((w) => !w.check());
    });
  }
  // Where the log ends now, for waitFor(re, {from}).
  mark() { return this.text.length; }

  // Resolves when `re` matches the log (from offset `from` on), rejects after `ms`.
  waitFor(re, { from = 0, ms = 20000 } = {}) {
    return new Promise((resolve, reject) => {
      const w = {
        check: () => {
          const m = this.text.slice(from).match(re);
          if (m) { clearTimeout(w.timer); resolve(m); return true; }
          return false;
        },
      };
      if (w.check()) return;
      w.timer = setTimeout(() => {
        this.waiters = this.waiters.filter((x) => x !== w);
        reject(new Error(`no log line matching ${re} within ${ms} ms; log so far:\n${this.text}`));
      }, ms);
      this.waiters.push(w);
    });
  }
}

// `agentbox mcp` behind the SDK client over stdio.
export async function connectStdio(dirs, extra = [], env = {}) {
  const transport = new StdioClientTransport({
    command: BIN, args: serverArgs(dirs, extra), env: { ...childEnv(), ...env }, stderr: 'pipe', cwd: dirs.root,
  });
  const log = new LineLog(transport.stderr);
  const client = new Client({ name: 'agentbox-mcp-test', version: '1.0.0' });
  await client.connect(transport);
  return { client, transport, log };
}

// `agentbox mcp` as a raw child: send lines, read responses by id.
export class RawServer {
  constructor(dirs, extra = []) {
    this.child = spawn(BIN, serverArgs(dirs, extra), { env: childEnv(), stdio: ['pipe', 'pipe', 'pipe'] });
    this.log = new LineLog(this.child.stderr);
    this.lines = [];
    this.waiters = [];
    this.stdoutText = '';
    this.child.stdout.setEncoding('utf8');
    this.child.stdout.on('data', (chunk) => {
      this.stdoutText += chunk;
      let nl;
      while ((nl = this.stdoutText.indexOf('\n')) >= 0) {
        const line = this.stdoutText.slice(0, nl);
        this.stdoutText = this.stdoutText.slice(nl + 1);
        this.lines.push(line);
        this.waiters.forEach((w) => w());
      }
    });
    this.exited = new Promise((resolve) => {
      this.child.on('exit', (code, signal) => resolve({ code, signal }));
      this.child.on('error', (error) => resolve({ code: null, signal: null, error }));  // did not start
    });
  }

  send(text) {
    return new Promise((resolve, reject) => this.child.stdin.write(text + '\n', (err) => (err ? reject(err) : resolve())));
  }

  request(id, method, params) {
    const msg = { jsonrpc: '2.0', id, method };
    if (params !== undefined) msg.params = params;
    return this.send(JSON.stringify(msg));
  }

  // The next message (parsed) that satisfies `pred`; every line must be JSON.
  next(pred = () => true, ms = 20000) {
    return new Promise((resolve, reject) => {
      const check = () => {
        for (let i = 0; i < this.lines.length; i++) {
          const msg = JSON.parse(this.lines[i]);  // a non-JSON line on stdout fails the test
          if (pred(msg)) {
            this.lines.splice(i, 1);
            return msg;
          }
        }
        return undefined;
      };
      const found = check();
      if (found) return resolve(found);
      const timer = setTimeout(() => reject(new Error(`no matching message within ${ms} ms; stderr:\n${this.log.text}`)), ms);
      const waiter = () => {
        const m = check();
        if (m) {
          clearTimeout(timer);
          this.waiters = this.waiters.filter((w) => w !== waiter);
          resolve(m);
        }
      };
      this.waiters.push(waiter);
    });
  }

  response(id, ms) { return this.next((m) => m.id === id && ('result' in m || 'error' in m), ms); }

  async initialize(version = '2025-06-18') {
    await this.request(1, 'initialize', { protocolVersion: version, capabilities: {}, clientInfo: { name: 'raw', version: '1' } });
    const r = await this.response(1);
    await this.send(JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }));
    return r;
  }

  async close() {
    this.child.stdin.end();
    const end = await this.exited;
    return end;
  }
}

// The text items of a CallToolResult, joined.
export function toolText(result) {
  return result.content.map((c) => c.text ?? '').join('\n');
}

// The JSON lines of `file` (none while it does not exist).
export function jsonLines(file) {
  if (!fs.existsSync(file)) return [];
  return fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
}
