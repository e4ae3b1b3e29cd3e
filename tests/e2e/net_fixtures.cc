#include "net_fixtures.h"

#include <unistd.h>

#include <cstdlib>

namespace agentbox::e2e {

std::string Python() { return FindTool("python3"); }

const nlohmann::json* DenialFor(const RunResult& r, const std::string& target) {
  if (!r.report || !(*r.report)["denials"].is_array()) return nullptr;
  for (const auto& d : (*r.report)["denials"]) {
    if (d["facet"] == "network" && d["target"] == target) return &d;
  }
  return nullptr;
}

const nlohmann::json* Connections(const RunResult& r) {
  if (!r.report || !(*r.report)["network"].is_object()) return nullptr;
  return &(*r.report)["network"]["connections"];
}

HostScript::HostScript(const Sandbox& sb, const std::string& name, const std::string& script,
                       const std::vector<std::string>& args) {
  const std::string path = sb.scratch() + "/" + name;
  WriteFile(path, script, 0644);
  Command c;
  c.argv = {Python(), path};
  c.argv.insert(c.argv.end(), args.begin(), args.end());
  c.cwd = sb.scratch();
  c.env = sb.Env();
  process_ = std::make_unique<Process>(c);
  if (!process_->started() || !process_->WaitForStdout("\n", 15000)) return;
  const std::string& out = process_->out();
  if (out.rfind("PORT ", 0) == 0) port_ = std::atoi(out.c_str() + 5);
}

std::string HostScript::Output(const std::string& needle, int wait_ms) {
  // A NUL never appears in the scripts' line-oriented output.
  if (wait_ms > 0) process_->WaitForStdout(needle.empty() ? std::string(1, '\0') : needle, wait_ms);
  return process_->out() + process_->err();
}

TestCa::TestCa(const std::string& dir) {
  const std::string openssl = FindTool("openssl");
  if (openssl.empty()) {
    log = "openssl not found";
    return;
  }
  ca_pem = dir + "/ca.pem";
  server_pem = dir + "/server.pem";
  server_key = dir + "/server.key";
  WriteFile(dir + "/server.ext",
            "subjectAltName=DNS:tls.test,DNS:front.test,DNS:api.test,DNS:evil.test,DNS:git.test,IP:127.0.0.1\n"
            "basicConstraints=critical,CA:FALSE\n"
            "keyUsage=critical,digitalSignature\n"
            "extendedKeyUsage=serverAuth\n");
  const std::vector<std::vector<std::string>> steps = {
      {openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
       dir + "/ca.key", "-out", ca_pem, "-days", "2", "-subj", "/CN=agentbox test CA", "-addext",
       "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"},
      {openssl, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
       server_key, "-out", dir + "/server.csr", "-subj", "/CN=tls.test"},
      {openssl, "x509", "-req", "-in", dir + "/server.csr", "-CA", ca_pem, "-CAkey", dir + "/ca.key",
       "-CAcreateserial", "-out", server_pem, "-days", "2", "-extfile", dir + "/server.ext"}};
  for (const auto& argv : steps) {
    Command c;
    c.argv = argv;
    c.cwd = dir;
    c.env = {"PATH=/usr/bin:/bin", "HOME=" + dir, "RANDFILE=" + dir + "/.rnd"};
    RunResult r = RunCommand(c);
    log += r.out + r.err;
    if (r.status != 0) return;
  }
  ok = true;
}

// The end of a python3 test server: a threading HTTP server whose connections
// each do their TLS handshake in their own thread (a client that stalls holds
// up nobody), on 127.0.0.1:0, printing "PORT <n>" first. The script before it
// defines `Handler` and `ctx` (an ssl.SSLContext, or None for plain HTTP).
const char* const kThreadingServerMain = R"PY(class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    def finish_request(self, request, client_address):
        if ctx is None:
            return super().finish_request(request, client_address)
        # The handshake in the connection's own thread: a client that stalls
        # holds up nobody else.
        request.settimeout(30)
        try:
            conn = ctx.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError) as e:
            print("TLS-FAILED", type(e).__name__, e, flush=True)
            return
        try:
            self.RequestHandlerClass(conn, client_address, self)
        finally:
            conn.close()
srv = Server(("127.0.0.1", 0), Handler)
print("PORT", srv.server_address[1], flush=True)
srv.serve_forever()
)PY";

const std::string kGitServer = R"PY(
import base64, http.server, os, ssl, subprocess, sys
root, args = sys.argv[1], sys.argv[2:]
ctx, basic = None, None
while args:
    if args[0] == "--tls":
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args[1], args[2])
        args = args[3:]
    elif args[0] == "--basic":
        basic = (args[1], "Basic " + base64.b64encode((args[1] + ":" + args[2]).encode()).decode())
        args = args[3:]
    else:
        sys.exit("git_server: unknown argument " + args[0])
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def do_GET(self):
        self.cgi()
    def do_POST(self):
        self.cgi()
    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""
    def cgi(self):
        path, _, query = self.path.partition("?")
        body = self.body()
        got = self.headers.get("Authorization")
        auth = "none" if got is None else ("ok" if basic and got == basic[1] else "bad")
        if basic and auth != "ok":
            print("GIT", self.command, path, 401, "auth=" + auth, flush=True)
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        env = {"GIT_PROJECT_ROOT": root, "GIT_HTTP_EXPORT_ALL": "1", "PATH_INFO": path,
               "QUERY_STRING": query, "REQUEST_METHOD": self.command,
               "CONTENT_TYPE": self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
               "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
               "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""), "REMOTE_ADDR": "127.0.0.1",
               "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": root}
        if basic:
            env["REMOTE_USER"] = basic[0]
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
        sep = b"\r\n\r\n" if b"\r\n\r\n" in out else b"\n\n"
        head, _, payload = out.partition(sep)
        status, fields = 200, []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                fields.append((name, value.strip()))
        # Printed before the answer leaves: a client that has it finds the line.
        print("GIT", self.command, path, status, "auth=" + auth, flush=True)
        self.send_response(status)
        for name, value in fields:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
    def log_message(self, *args):
        pass
)PY" + std::string(kThreadingServerMain);

const char* const kThreadedClient = R"PY(
import os, socket, sys, threading, urllib.request
for name in ("NO_PROXY", "no_proxy"):
    os.environ.pop(name, None)
def in_worker(call):
    out = []
    def run():
        try:
            if threading.get_native_id() == os.getpid():
                raise RuntimeError("not a worker thread")
            out.append(call())
        except OSError as e:
            out.append("errno=%d" % e.errno if e.errno else repr(e))
        except Exception as e:
            out.append(repr(e))
    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out[0]
print("fetch", in_worker(lambda: urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()), flush=True)
if len(sys.argv) > 2:
    host, port = sys.argv[2].rsplit(":", 1)
    def direct():
        socket.create_connection((host, int(port)), timeout=10).close()
        return "ok"
    print("direct", in_worker(direct), flush=True)
)PY";

const char* const kWithBinds = R"PY(
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
sep = sys.argv.index("--")
pairs, argv = sys.argv[1:sep], sys.argv[sep + 1:]
uid, gid = os.getuid(), os.getgid()
CLONE_NEWNS, CLONE_NEWUSER = 0x20000, 0x10000000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 1 << 18
def check(rc, what):
    if rc != 0:
        sys.exit("with-binds: %s: %s" % (what, os.strerror(ctypes.get_errno())))
check(libc.unshare(CLONE_NEWNS if uid == 0 else CLONE_NEWNS | CLONE_NEWUSER), "unshare")
if uid != 0:
    for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)), ("gid_map", "%d %d 1" % (gid, gid))):
        with open("/proc/self/" + name, "w") as f:
            f.write(text)
check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
for source, target in zip(pairs[0::2], pairs[1::2]):
    check(libc.mount(source.encode(), target.encode(), None, MS_BIND, None), "bind %s over %s" % (source, target))
os.execv(argv[0], argv)
)PY";

RunResult RunWithHosts(const Sandbox& sb, const std::string& hosts, const std::string& script,
                       const std::vector<std::string>& options, int timeout_ms,
                       const std::vector<std::string>& extra_env) {
  WriteFile(sb.scratch() + "/hosts", hosts);
  WriteFile(sb.scratch() + "/with_binds.py", kWithBinds);
  unlink(sb.report_path().c_str());
  std::vector<std::string> args = {Python(), sb.scratch() + "/with_binds.py", sb.scratch() + "/hosts", "/etc/hosts",
                                   "--", AgentboxBin(), "run", "--report", sb.report_path()};
  args.insert(args.end(), options.begin(), options.end());
  args.insert(args.end(), {"--", "sh", "-c", script});
  Command c = sb.AgentboxCommand({}, extra_env);
  c.argv = args;
  c.timeout_ms = timeout_ms;
  RunResult r = RunCommand(c);
  if (auto text = ReadFile(sb.report_path())) {
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (!j.is_discarded()) r.report = std::move(j);
  }
  return r;
}

}  // namespace agentbox::e2e
