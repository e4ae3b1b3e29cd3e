// A test upstream MCP server for the tool gateway (gateway*.test.mjs): an
// issue tracker built on the official SDK's Server class. It appends one
// JSON line per tools/call to the file named by its first argument: the
// tool, its arguments, the token it was given and its pid. Tools:
// search_issues, get_issue, delete_everything (a tool the policy does not
// allow), slow (answers after 10 s), crash (exits 3).
//
//   upstream_tracker.mjs LOG                  stdio; the token from MCP_TOKEN
//   upstream_tracker.mjs LOG --http PORTFILE  Streamable HTTP on 127.0.0.1
//     (an ephemeral port, written to PORTFILE once it listens): /mcp answers
//     as an event stream, /mcp-json as JSON bodies; every request must carry
//     `Authorization: Bearer $TRACKER_EXPECT_TOKEN` (else 401); sessions by
//     Mcp-Session-Id; POST /end-sessions drops every session (the next
//     request with an old id gets 404); /moved redirects (307) to /mcp.
//   upstream_tracker.mjs LOG --http PORTFILE CERT KEY   the same over https
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';

import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { CallToolRequestSchema, ListToolsRequestSchema, isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';

const logFile = process.argv[2];
const httpPortFile = process.argv[3] === '--http' ? process.argv[4] : undefined;
const tlsFiles = process.argv[5] ? { cert: fs.readFileSync(process.argv[5]), key: fs.readFileSync(process.argv[6]) } : undefined;

const ISSUES = Array.from({ length: 40 }, (_, i) => ({
  id: i + 1,
  title: `${i % 3 === 0 ? 'crash' : 'slowness'} in module ${i % 5}`,
  state: i % 4 === 0 ? 'closed' : 'open',
}));

const TOOLS = [
  {
    name: 'search_issues',
    description: 'Search issues by a word in their title.',
    inputSchema: {
      type: 'object',
      properties: { query: { type: 'string', minLength: 1 }, limit: { type: 'integer', minimum: 1 } },
      required: ['query'],
      additionalProperties: false,
    },
  },
  {
    name: 'get_issue',
    description: 'One issue by its id.',
    inputSchema: { type: 'object', properties: { id: { type: 'integer' } }, required: ['id'], additionalProperties: false },
  },
  { name: 'delete_everything', description: 'Deletes every issue.', inputSchema: { type: 'object' } },
  { name: 'slow', description: 'Answers after 10 s.', inputSchema: { type: 'object' } },
  { name: 'crash', description: 'Exits with status 3.', inputSchema: { type: 'object' } },
];

function makeServer() {
  const server = new Server({ name: 'tracker', version: '1.0.0' }, { capabilities: { tools: {} } });
  server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: TOOLS }));
  server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
    const { name, arguments: args = {} } = request.params;
    const header = extra?.requestInfo?.headers?.authorization;
    const token = httpPortFile ? String(header ?? '').replace(/^Bearer /, '') : (process.env.MCP_TOKEN ?? '');
    fs.appendFileSync(logFile, JSON.stringify({ tool: name, args, token, pid: process.pid, path: extra?.requestInfo?.url }) + '\n');
    const text = (t) => ({ content: [{ type: 'text', text: t }] });
    switch (name) {
      case 'search_issues': {
        const found = ISSUES.filter((i) => i.title.includes(args.query)).slice(0, args.limit ?? 100);
        return { ...text(JSON.stringify(found)), structuredContent: { issues: found } };
      }
      case 'get_issue': {
        const issue = ISSUES.find((i) => i.id === args.id);
        return issue ? text(JSON.stringify(issue)) : { ...text(`no issue ${args.id}`), isError: true };
      }
      case 'delete_everything':
        return text('deleted everything');
      case 'slow':
        await new Promise((resolve) => setTimeout(resolve, 10000));
        return text('late');
      case 'crash':
        process.stderr.write('tracker: crashing on purpose\n');
        process.exit(3);
      default:
        return { ...text(`unknown tool ${name}`), isError: true };
    }
  });

  return server;
}

async function serveHttp(portFile) {
  const expected = `Bearer ${process.env.TRACKER_EXPECT_TOKEN}`;
  const sessions = new Map();
  const handler = async (req, res) => {
    try {
      const chunks = [];
      for await (const c of req) chunks.push(c);
      const url = new URL(req.url, 'http://127.0.0.1');
      if (req.method === 'POST' && url.pathname === '/end-sessions') {
        for (const t of sessions.values()) await t.close();
        sessions.clear();
        res.writeHead(204).end();
        return;
      }
      if (url.pathname === '/moved') {
        res.writeHead(307, { Location: '/mcp' }).end();
        return;
      }
      if (req.headers.authorization !== expected) {
        res.writeHead(401, { 'WWW-Authenticate': 'Bearer realm="tracker"' }).end('bad token');
        return;
      }
      const body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
      const sid = req.headers['mcp-session-id'];
      let transport = sid ? sessions.get(`${url.pathname} ${sid}`) : undefined;
      if (!transport) {
        if (sid || !isInitializeRequest(body)) {
          res.writeHead(sid ? 404 : 400, { 'Content-Type': 'application/json' })
            .end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32000, message: sid ? 'Session not found' : 'No session' }, id: null }));
          return;
        }
        transport = new StreamableHTTPServerTransport({
          sessionIdGenerator: () => crypto.randomUUID(),
          enableJsonResponse: url.pathname === '/mcp-json',
          onsessioninitialized: (id) => sessions.set(`${url.pathname} ${id}`, transport),
        });
        await makeServer().connect(transport);
      }
      await transport.handleRequest(req, res, body);
    } catch (e) {
      if (!res.headersSent) res.writeHead(500).end(String(e));
    }
  };
  const httpServer = tlsFiles ? https.createServer(tlsFiles, handler) : http.createServer(handler);
  httpServer.listen(0, '127.0.0.1', () => {
    fs.writeFileSync(`${portFile}.tmp`, String(httpServer.address().port));
    fs.renameSync(`${portFile}.tmp`, portFile);
  });
}

if (httpPortFile) await serveHttp(httpPortFile);
else await makeServer().connect(new StdioServerTransport());
