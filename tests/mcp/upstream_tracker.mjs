// A test upstream MCP server for the tool gateway (gateway.test.mjs): an
// issue tracker over stdio, built on the official SDK's Server class. It
// appends one JSON line per tools/call to the file named by its first
// argument: the tool, its arguments, the token it found in MCP_TOKEN and
// its pid. Tools: search_issues, get_issue, delete_everything (a tool the
// policy does not allow), slow (answers after 10 s), crash (exits 3).
import fs from 'node:fs';

import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { CallToolRequestSchema, ListToolsRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const logFile = process.argv[2];
const token = process.env.MCP_TOKEN ?? '';

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

const server = new Server({ name: 'tracker', version: '1.0.0' }, { capabilities: { tools: {} } });
server.setRequestHandler(ListToolsRequestSchema, async () => ({ tools: TOOLS }));
server.setRequestHandler(CallToolRequestSchema, async (request) => {
  const { name, arguments: args = {} } = request.params;
  fs.appendFileSync(logFile, JSON.stringify({ tool: name, args, token, pid: process.pid }) + '\n');
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

await server.connect(new StdioServerTransport());
