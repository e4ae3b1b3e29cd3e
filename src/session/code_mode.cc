#include "session/code_mode.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace agentbox::session {

namespace {

// The Python prelude (python3 -I -u -c): isolated, so that no workspace
// file shadows a module it imports; the workspace joins sys.path after.
constexpr const char* kPythonPrelude = R"PY(
import ast, asyncio, builtins, errno, inspect, json, keyword, linecache, os, socket, sys, traceback, types
_CH = 3
_buf = b""
def _recv():
    global _buf
    while b"\n" not in _buf:
        chunk = os.read(_CH, 1 << 16)
        if not chunk:
            raise ConnectionError("agentbox: the tools channel is closed")
        _buf += chunk
    line, _, _buf = _buf.partition(b"\n")
    return json.loads(line)
def _send(msg):
    try:
        text = json.dumps(msg, allow_nan=False, default=repr)
    except (ValueError, TypeError, RecursionError):
        msg = dict(msg); msg["value"] = repr(msg.get("value"))
        text = json.dumps(msg, default=repr)
    data = (text + "\n").encode("utf-8", "backslashreplace")
    while data:
        data = data[os.write(_CH, data):]
class ToolError(Exception):
    """A tool call that failed: .tool, .kind, .output and .result (the whole result)."""
    def __init__(self, tool, result):
        self.tool, self.result = tool, result
        self.kind, self.output = result.get("kind"), result.get("output", "")
        first = self.output.splitlines()[0] if self.output else str(self.kind)
        super().__init__(tool + ": " + first)
_ids = [0]
def _call(name, arguments):
    _ids[0] += 1
    n = _ids[0]
    _send({"t": "call", "id": n, "name": name, "input": arguments})
    while True:
        m = _recv()
        if m.get("t") == "return" and m.get("id") == n:
            return m["result"]
def _value(r):
    up = r.get("upstream")
    if isinstance(up, dict) and "structuredContent" in up:
        return up["structuredContent"]
    return r.get("output", "")
_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "object": "dict", "array": "list"}
def _binding(spec):
    name = spec["name"]
    schema = spec.get("inputSchema") or {}
    props = schema.get("properties") or {}
    required = [p for p in (schema.get("required") or []) if p in props]
    order = required + [p for p in props if p not in required]
    params = []
    for p in order:
        if not p.isidentifier() or keyword.iskeyword(p):
            continue
        t = props[p].get("type") if isinstance(props[p], dict) else None
        params.append(inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                        default=inspect.Parameter.empty if p in required else None,
                                        annotation=_TYPES.get(t, "object") if isinstance(t, str) else "object"))
    sig = inspect.Signature(params)
    async def binding(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        arguments = {k: v for k, v in bound.arguments.items() if k in required or v is not None}
        r = _call(name, arguments)
        if r.get("is_error"):
            raise ToolError(name, r)
        return _value(r)
    binding.__signature__ = sig
    binding.__name__ = name.split(".")[-1]
    binding.__qualname__ = name
    lines = [spec.get("description", ""), ""]
    for p in order:
        d = props[p].get("description", "") if isinstance(props[p], dict) else ""
        lines.append("  " + p + (" (required)" if p in required else "") + (": " + d if d else ""))
    binding.__doc__ = "\n".join(lines)
    return binding
async def call(name, input=None):
    """Calls any tool by name with an input dict; returns the whole result (never raises)."""
    return _call(name, dict(input or {}))
def _denied(op, target):
    _send({"t": "denied", "op": op, "target": target})
    return PermissionError(errno.EACCES, "run_code programs have no network: " + target +
                           " refused; reach the outside through the tools module")
_getaddrinfo = socket.getaddrinfo
def _no_getaddrinfo(host, port, *a, **k):
    raise _denied("resolve", str(host) + ":" + str(port))
def _no_connection(address, *a, **k):
    raise _denied("connect", ":".join(str(x) for x in address[:2]))
_socket_init = socket.socket.__init__
def _no_socket(self, family=-1, type=-1, proto=-1, fileno=None):
    if fileno is None:
        raise _denied("socket", "socket()")
    _socket_init(self, family, type, proto, fileno)
socket.getaddrinfo = _no_getaddrinfo
socket.create_connection = _no_connection
socket.socket.__init__ = _no_socket
def _traceback(e):
    te = traceback.TracebackException.from_exception(e)
    seen = set()
    def prune(t):
        if t is None or id(t) in seen:
            return
        seen.add(id(t))
        t.stack = traceback.StackSummary.from_list([f for f in t.stack if f.filename == "<code>"])
        prune(t.__cause__)
        prune(t.__context__)
    prune(te)
    line = e.lineno if isinstance(e, SyntaxError) and e.filename == "<code>" else None
    if line is None and te.stack:
        line = te.stack[-1].lineno
    return "".join(te.format()), line
def _main():
    program = _recv()
    code = program.get("code", "")
    tools = types.ModuleType("tools", "The session's tools: one async function each, generated from their JSON Schemas.")
    for spec in program.get("tools", []):
        parts = spec["name"].split(".")
        target = tools
        for part in parts[:-1]:
            if not hasattr(target, part):
                setattr(target, part, types.SimpleNamespace())
            target = getattr(target, part)
        setattr(target, parts[-1], _binding(spec))
    tools.call = call
    tools.ToolError = ToolError
    sys.modules["tools"] = tools
    sys.path.insert(0, os.getcwd())
    linecache.cache["<code>"] = (len(code), None, code.splitlines(True), "<code>")
    chosen = []
    def result(value):
        """Makes `value` the program's result (instead of the last expression's)."""
        chosen[:] = [value]
    g = {"__name__": "__main__", "__builtins__": builtins, "tools": tools, "result": result}
    try:
        tree = ast.parse(code, "<code>", "exec")
        last = tree.body[-1] if tree.body else None
        if isinstance(last, ast.Expr):
            assign = ast.Assign(targets=[ast.Name("__agentbox_last__", ast.Store())], value=last.value)
            tree.body[-1] = ast.fix_missing_locations(ast.copy_location(assign, last))
        obj = compile(tree, "<code>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
        ran = eval(obj, g)
        if inspect.iscoroutine(ran):
            asyncio.run(ran)
        value = chosen[0] if chosen else g.get("__agentbox_last__")
        if inspect.iscoroutine(value):
            value = asyncio.run(value)
    except SystemExit:
        raise
    except BaseException as e:
        text, line = _traceback(e)
        sys.stderr.write(text)
        sys.stderr.flush()
        _send({"t": "error", "type": type(e).__name__, "message": str(e), "line": line, "traceback": text})
        os._exit(1)
    if value is not None:
        _send({"t": "result", "value": value})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
_main()
)PY";

// The JavaScript prelude (node -e). Code without a top-level await runs as
// a script (its last expression is the result; a promise is awaited); with
// one, as the body of an async function (`return` or result(...)).
constexpr const char* kJavaScriptPrelude = R"JS(
'use strict';
const fs = require('fs'), vm = require('vm'), net = require('net'), dns = require('dns'), dgram = require('dgram');
const CH = 3;
let buf = Buffer.alloc(0);
function recv() {
  for (;;) {
    const nl = buf.indexOf(10);
    if (nl >= 0) {
      const line = buf.subarray(0, nl).toString('utf8');
      buf = buf.subarray(nl + 1);
      return JSON.parse(line);
    }
    const chunk = Buffer.alloc(65536);
    let n;
    try { n = fs.readSync(CH, chunk, 0, chunk.length, null); } catch (e) { if (e.code === 'EAGAIN' || e.code === 'EINTR') continue; throw e; }
    if (n === 0) throw new Error('agentbox: the tools channel is closed');
    buf = Buffer.concat([buf, chunk.subarray(0, n)]);
  }
}
function send(msg) {
  let text;
  try { text = JSON.stringify(msg); } catch (e) { text = JSON.stringify(Object.assign({}, msg, {value: String(msg.value)})); }
  const data = Buffer.from(text + '\n', 'utf8');
  let off = 0;
  while (off < data.length) {
    try { off += fs.writeSync(CH, data, off); } catch (e) { if (e.code !== 'EAGAIN' && e.code !== 'EINTR') throw e; }
  }
}
class ToolError extends Error {
  constructor(tool, r) {
    super(tool + ': ' + ((r.output || '').split('\n')[0] || r.kind));
    this.name = 'ToolError'; this.tool = tool; this.kind = r.kind; this.output = r.output; this.result = r;
  }
}
let ids = 0;
function callSync(name, input) {
  const id = ++ids;
  send({t: 'call', id, name, input});
  for (;;) {
    const m = recv();
    if (m.t === 'return' && m.id === id) return m.result;
  }
}
function value(r) {
  if (r.upstream && Object.prototype.hasOwnProperty.call(r.upstream, 'structuredContent')) return r.upstream.structuredContent;
  return r.output === undefined ? '' : r.output;
}
function binding(spec) {
  const schema = spec.inputSchema || {}, props = schema.properties || {};
  const required = (schema.required || []).filter((p) => p in props);
  const order = required.concat(Object.keys(props).filter((p) => !required.includes(p)));
  const shape = '{' + order.map((p) => p + (required.includes(p) ? '' : '?') + ': ' + ((props[p] && props[p].type) || 'any')).join(', ') + '}';
  const doc = (spec.description || '') + '\n' + order.map((p) => '  ' + p + (required.includes(p) ? ' (required)' : '') +
      (props[p] && props[p].description ? ': ' + props[p].description : '')).join('\n');
  const fn = async function (input = {}) {
    if (typeof input !== 'object' || input === null || Array.isArray(input)) {
      throw new TypeError(spec.name + ' takes one object argument: ' + shape);
    }
    const r = callSync(spec.name, input);
    if (r.is_error) throw new ToolError(spec.name, r);
    return value(r);
  };
  Object.defineProperty(fn, 'name', {value: spec.name});
  fn.doc = doc; fn.signature = 'async ' + spec.name + '(' + shape + ')'; fn.inputSchema = schema;
  fn.toString = () => '/** ' + doc + ' */\n' + fn.signature;
  return fn;
}
function denied(op, target) {
  send({t: 'denied', op, target});
  const e = new Error('run_code programs have no network: ' + target + ' refused; reach the outside through the tools object');
  e.code = 'EACCES';
  return e;
}
function targetOf(args) {
  const a = args[0];
  if (Array.isArray(a)) return targetOf(a);
  if (a && typeof a === 'object') return a.path ? String(a.path) : (a.host || 'localhost') + ':' + a.port;
  if (typeof a === 'string' && isNaN(Number(a))) return a;
  return (typeof args[1] === 'string' ? args[1] : 'localhost') + ':' + a;
}
net.Socket.prototype.connect = function (...args) { throw denied('connect', targetOf(args)); };
dns.lookup = function (host) { throw denied('resolve', String(host)); };
dns.promises.lookup = async function (host) { throw denied('resolve', String(host)); };
dgram.createSocket = function () { throw denied('socket', 'udp'); };
globalThis.fetch = async function (input) {
  let target = String(input && input.url ? input.url : input);
  try { const u = new URL(target); target = u.host; } catch (e) {}
  throw denied('connect', target);
};
function userStack(e) {
  if (!(e instanceof Error)) return 'Uncaught ' + String(e) + '\n';
  const lines = String(e.stack || e).split('\n');
  const kept = [];
  let frames = false;
  for (const line of lines) {
    if (/^\s+at /.test(line)) { frames = true; if (line.includes('code.js:')) kept.push(line); } else if (!frames) kept.push(line);
  }
  return kept.join('\n') + '\n';
}
function lineOf(text) {
  const m = /code\.js:(\d+)/.exec(text);
  return m ? Number(m[1]) : null;
}
(async () => {
  const program = recv();
  const code = program.code || '';
  const tools = {call: async (name, input) => callSync(name, input || {}), ToolError};
  for (const spec of program.tools || []) {
    const parts = spec.name.split('.');
    let target = tools;
    for (const part of parts.slice(0, -1)) target = target[part] = target[part] || {};
    target[parts[parts.length - 1]] = binding(spec);
  }
  let chosen = false, chosenValue;
  globalThis.tools = tools;
  globalThis.result = (v) => { chosen = true; chosenValue = v; };
  let value;
  try {
    let script;
    try {
      script = new vm.Script(code, {filename: 'code.js'});
    } catch (e) {
      if (!(e instanceof SyntaxError) || !/await|Illegal return/.test(e.message)) throw e;
      script = new vm.Script('(async () => {' + code + '\n})()', {filename: 'code.js'});
    }
    value = script.runInThisContext();
    if (value && typeof value.then === 'function') value = await value;
    if (chosen) value = chosenValue;
    if (value && typeof value.then === 'function') value = await value;
  } catch (e) {
    const text = userStack(e);
    process.stderr.write(text);
    send({t: 'error', type: (e && e.name) || typeof e, message: String(e && e.message !== undefined ? e.message : e), line: lineOf(text), traceback: text});
    process.exit(1);
  }
  if (value !== undefined) send({t: 'result', value: value === null ? null : value});
  process.exit(0);
})();
)JS";

std::string Text(const Json& m, const char* key) {
  auto it = m.find(key);
  return it != m.end() && it->is_string() ? it->get<std::string>() : "";
}

std::string FindOnSystem(const std::string& name) {
  for (const char* dir : {"/usr/bin/", "/bin/"}) {
    const std::string path = dir + name;
    struct stat st {};
    if (stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111)) return path;
  }
  return "";
}

}  // namespace

std::vector<CodeRuntime> CodeRuntimes() {
  std::vector<CodeRuntime> out;
  for (auto [language, interpreter] : {std::pair{"python", "python3"}, std::pair{"javascript", "node"}}) {
    CodeRuntime r{language, interpreter, FindOnSystem(interpreter), ""};
    if (r.path.empty()) {
      r.why_absent = std::string(interpreter) + " is not installed in /usr/bin or /bin (the read-only system the sandbox sees)";
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::optional<CodeRuntime> FindCodeRuntime(const std::string& language) {
  for (auto& r : CodeRuntimes()) {
    if (r.language == language) return r;
  }
  return std::nullopt;
}

std::vector<std::string> PreludeArgv(const std::string& language, const std::string& path) {
  if (language == "python") return {path, "-I", "-u", "-c", kPythonPrelude};
  return {path, "-e", kJavaScriptPrelude};
}

BindingServer::BindingServer(linux::UniqueFd fd, Json program, Dispatch dispatch, std::size_t max_calls,
                             std::size_t max_line)
    : fd_(std::move(fd)), program_(std::move(program)), dispatch_(std::move(dispatch)), max_calls_(max_calls),
      max_line_(max_line) {
  int wake[2];
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) == 0) {
    wake_r_.reset(wake[0]);
    wake_w_.reset(wake[1]);
  }
  thread_ = std::thread([this] { Serve(); });
}

BindingServer::~BindingServer() { (void)Finish(); }

ProgramReport BindingServer::Finish() {
  if (!finished_) {
    finished_ = true;
    stop_ = true;
    if (wake_w_.valid()) (void)!write(wake_w_.get(), "x", 1);
    if (thread_.joinable()) thread_.join();
    if (fd_.valid()) shutdown(fd_.get(), SHUT_RDWR);
    fd_.reset();
  }
  return report_;
}

void BindingServer::Serve() {
  // Writes all of `line`; false when the program's end is gone.
  auto send = [&](const Json& message) {
    const std::string line = message.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
    std::size_t off = 0;
    while (off < line.size() && !stop_) {
      ssize_t w = ::send(fd_.get(), line.data() + off, line.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        off += static_cast<std::size_t>(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno == EAGAIN) {
        struct pollfd p[2] = {{fd_.get(), POLLOUT, 0}, {wake_r_.get(), POLLIN, 0}};
        (void)poll(p, 2, -1);
        continue;
      }
      return false;
    }
    return off == line.size();
  };
  auto broken = [&](const std::string& why) {
    report_.protocol_error = why;
    shutdown(fd_.get(), SHUT_RDWR);
  };
  if (!send(program_)) return;
  std::string pending;
  char buf[65536];
  // The complete lines in `pending`; false once the channel is done with.
  // `last`: the program has ended, nothing is dispatched any more; what it
  // said before its end (its result, an error, denials) still counts.
  auto take_lines = [&](bool last) -> bool {
    std::size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      Json m = Json::parse(pending.substr(0, nl), nullptr, false);
      pending.erase(0, nl + 1);
      const std::string t = m.is_object() && m.contains("t") && m["t"].is_string() ? m["t"].get<std::string>() : "";
      if (t == "call") {
        if (last) continue;
        const Json id = m.value("id", Json());
        if (!m.contains("name") || !m["name"].is_string() || !id.is_number_integer()) {
          broken("a call without a name or an integer id");
          return false;
        }
        Json result;
        if (++report_.calls > max_calls_) {
          result = {{"output", "tool_error: this program made more than " + std::to_string(max_calls_) +
                                   " tool calls (the limit of one run_code call)"},
                    {"is_error", true},
                    {"kind", "tool_error"}};
        } else {
          result = dispatch_(m["name"].get<std::string>(), m.value("input", Json::object()), &stop_);
        }
        if (!send({{"t", "return"}, {"id", id}, {"result", result}})) return false;
      } else if (t == "result") {
        report_.value = m.value("value", Json());
      } else if (t == "error") {
        m.erase("t");
        report_.error = m;
      } else if (t == "denied") {
        if (report_.denials.size() < 16) {
          report_.denials.push_back({{"op", Text(m, "op")}, {"target", Text(m, "target")}});
        }
      } else {
        broken("a line that is not a message of the protocol");
        return false;
      }
    }
    return true;
  };
  while (!stop_) {
    struct pollfd p[2] = {{fd_.get(), POLLIN, 0}, {wake_r_.get(), POLLIN, 0}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (stop_ || (p[1].revents & POLLIN)) break;
    if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    ssize_t got = read(fd_.get(), buf, sizeof(buf));
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) return;  // the program closed its end (it ended)
    pending.append(buf, static_cast<std::size_t>(got));
    if (!take_lines(false)) return;
    if (pending.size() > max_line_) return broken("a line longer than " + std::to_string(max_line_) + " bytes");
  }
  // Finish: the program has ended. What it wrote before that is read now,
  // however the loop saw the stop (the wake, or stop_ itself between two
  // rounds), so its result is not lost to a race with the call's end.
  for (ssize_t got; pending.size() <= max_line_ && (got = recv(fd_.get(), buf, sizeof(buf), MSG_DONTWAIT)) > 0;) {
    pending.append(buf, static_cast<std::size_t>(got));
  }
  take_lines(true);
}

}  // namespace agentbox::session
