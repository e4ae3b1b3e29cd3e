#include "net_fixtures.h"

#include <limits.h>
#include <stdlib.h>
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

namespace agentbox::e2e {

const char* const kWithNetns = R"PY(
import ctypes, json, os, signal, socket, struct, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x20000, 0x10000000, 0x40000000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 1 << 18
PR_SET_PDEATHSIG, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NET_ADMIN = 1, 47, 2, 12
spec = json.load(open(sys.argv[1]))
uid, gid = os.getuid(), os.getgid()

def fail(message):
    sys.stderr.write("with-netns: %s\n" % message)
    sys.stderr.flush()
    os._exit(120)

def check(rc, what):
    if rc != 0:
        fail("%s: %s" % (what, os.strerror(ctypes.get_errno())))

# --- namespaces
host_netns = os.stat("/proc/self/ns/net").st_ino
check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | (0 if uid == 0 else CLONE_NEWUSER)), "unshare")
if uid != 0:
    for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)), ("gid_map", "%d %d 1" % (gid, gid))):
        with open("/proc/self/" + name, "w") as f:
            f.write(text)
if os.stat("/proc/self/ns/net").st_ino == host_netns:
    fail("still in the network namespace it started in")
check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")

# --- the interfaces. Not root, the caller keeps its capabilities in the new
# user namespace only until it execs as a non-zero uid: `ip` gets
# CAP_NET_ADMIN as an ambient capability.
class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
def keep_net_admin():
    hdr, data = CapHeader(0x20080522, 0), (CapData * 2)()
    if libc.capget(ctypes.byref(hdr), data) != 0:
        os._exit(121)
    data[0].inheritable |= 1 << CAP_NET_ADMIN
    if libc.capset(ctypes.byref(hdr), data) != 0:
        os._exit(122)
    if libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NET_ADMIN, 0, 0) != 0:
        os._exit(123)
def ip(*args, may_fail=False):
    r = subprocess.run([spec["ip"]] + list(args), preexec_fn=keep_net_admin, capture_output=True, text=True)
    if r.returncode != 0 and not may_fail:
        fail("ip %s: exit %d: %s" % (" ".join(args), r.returncode, (r.stdout + r.stderr).strip()))
    return r.stdout if r.returncode == 0 else None
ip("link", "set", "lo", "up")
# A kernel built without the dummy driver may have bridges (a bridge with
# no ports serves its own addresses just the same); with neither, the
# addresses go on lo.
dev = "t0"
if ip("link", "add", "t0", "type", "dummy", may_fail=True) is None:
    if ip("link", "add", "t0", "type", "bridge", may_fail=True) is None:
        dev = "lo"
for address in spec["addresses"]:
    ip("addr", "add", address, "dev", dev)
ip("link", "set", dev, "up")
links = sorted(line.split(": ")[1].split("@")[0] for line in ip("-o", "link", "show").splitlines() if line.strip())
if links != sorted({"lo", dev}):
    fail("the new namespace has links %s, not only lo and %s" % (links, dev))
for family in ("-4", "-6"):
    routes = ip(family, "route", "show", "default").strip()
    if routes:
        fail("the new namespace has a default route: %s" % routes)
shown = ip("-o", "-4", "addr", "show", "dev", dev)
for address in spec["addresses"]:
    if " %s " % address not in shown:
        fail("%s lacks %s: %s" % (dev, address, shown))

# --- files
for name in spec["run_dirs"]:
    if os.path.isdir("/run/" + name):
        continue
    aside = spec["scratch"] + "/run-host"
    if not os.path.isdir(aside):
        os.mkdir(aside)
        check(libc.mount(b"/run", aside.encode(), None, MS_BIND | MS_REC, None), "bind /run aside")
        check(libc.mount(b"tmpfs", b"/run", b"tmpfs", 0, b"mode=0755"), "tmpfs over /run")
        for entry in os.listdir(aside):
            source, target = aside + "/" + entry, "/run/" + entry
            if os.path.islink(source):
                os.symlink(os.readlink(source), target)
                continue
            if os.path.isdir(source):
                os.mkdir(target)
            else:
                open(target, "w").close()
            check(libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None), "bind back " + target)
    os.mkdir("/run/" + name, 0o755)
for source, target in spec["binds"]:
    check(libc.mount(source.encode(), target.encode(), None, MS_BIND, None), "bind %s over %s" % (source, target))

# --- servers
def die_with_parent():
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
servers = []
def stop_servers():
    # Each server leads a process group of its own: `git daemon` runs
    # git-daemon as a child, which killing `git` alone would leave running.
    for p, _ in servers:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p, _ in servers:
        p.wait()
def hexaddr(address):
    return "%08X" % struct.unpack("=I", socket.inet_aton(address))[0]
def listening(listen):
    proto, address, port = listen.split(":")
    want = "%s:%04X" % (hexaddr(address), int(port))
    state = "0A" if proto == "tcp" else "07"
    with open("/proc/self/net/" + proto) as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[1] == want and fields[3] == state:
                return True
    return False
for s in spec["servers"]:
    log = open(s["log"], "wb")
    p = subprocess.Popen(s["argv"], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         cwd=s["cwd"] or None, preexec_fn=die_with_parent, start_new_session=True)
    log.close()
    servers.append((p, s))
deadline = time.monotonic() + 20
for p, s in servers:
    for listen in s["listens"]:
        while not listening(listen):
            if p.poll() is not None or time.monotonic() > deadline:
                why = "exited with %s" % p.returncode if p.returncode is not None else "is not listening after 20 s"
                stop_servers()
                fail("server %s %s (%s); it printed: %s" % (s["name"], why, listen, open(s["log"]).read()[-2000:]))
            time.sleep(0.02)

# --- the command
try:
    run = subprocess.Popen(spec["argv"])
except OSError as e:
    stop_servers()
    fail("cannot run %s: %s" % (spec["argv"][0], e))
rc = run.wait()
stop_servers()
sys.exit(rc if rc >= 0 else 128 - rc)
)PY";

const char* const kNetnsServer = R"PY(
import socket, sys, threading
def answer(conn, name):
    try:
        conn.settimeout(10)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
        if b"\r\n\r\n" in data:
            body = ("hello from %s\n" % name).encode()
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n" % len(body) + body)
            print("SERVED", name, data.split(b"\r\n")[0].decode("latin-1"), flush=True)
    except OSError as e:
        print("ERROR", name, e, flush=True)
    finally:
        conn.close()
def serve_tcp(srv, name):
    while True:
        conn, _ = srv.accept()
        print("ACCEPT", name, flush=True)
        threading.Thread(target=answer, args=(conn, name), daemon=True).start()
def serve_udp(srv, name):
    while True:
        data, _ = srv.recvfrom(65535)
        print("UDP", name, len(data), "bytes", flush=True)
threads = []
for arg in sys.argv[1:]:
    proto, host, port = arg.split(":")
    name = "%s:%s" % (host, port)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(port)))
    if proto == "tcp":
        s.listen(512)
    threads.append(threading.Thread(target=serve_tcp if proto == "tcp" else serve_udp, args=(s, name), daemon=True))
for t in threads:
    t.start()
for t in threads:
    t.join()
)PY";

std::string TestNetns::WhyNot() {
  if (Python().empty()) return "python3 is not installed";
  if (FindTool("ip").empty()) return "ip (iproute2) is not installed";
  return "";
}

TestNetns::TestNetns(const Sandbox& sb, std::string hosts) : sb_(sb), hosts_(std::move(hosts)) {}

void TestNetns::AddServer(const std::string& name, const std::vector<std::string>& argv,
                          const std::vector<std::string>& listens, const std::string& cwd) {
  servers_.push_back({{"name", name},
                      {"argv", argv},
                      {"listens", listens},
                      {"cwd", cwd},
                      {"log", sb_.scratch() + "/" + name + ".log"}});
}

void TestNetns::AddPythonServer(const std::string& name, const std::vector<std::string>& listens) {
  const std::string path = sb_.scratch() + "/netns_server.py";
  WriteFile(path, kNetnsServer);
  std::vector<std::string> argv = {Python(), path};
  argv.insert(argv.end(), listens.begin(), listens.end());
  AddServer(name, argv, listens);
}

RunResult TestNetns::Sh(const std::string& script, const std::vector<std::string>& options, int timeout_ms,
                        const std::vector<std::string>& extra_env) const {
  const std::string scratch = sb_.scratch();
  WriteFile(scratch + "/netns-hosts", hosts_);
  // The supervisor's resolver finds the test's names in the hosts file;
  // anything else goes to a nameserver that is not there.
  WriteFile(scratch + "/netns-resolv.conf", "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n");
  WriteFile(scratch + "/with_netns.py", kWithNetns);
  nlohmann::json binds = nlohmann::json::array({{scratch + "/netns-hosts", "/etc/hosts"}});
  char real[PATH_MAX];
  if (realpath("/etc/resolv.conf", real)) binds.push_back({scratch + "/netns-resolv.conf", "/etc/resolv.conf"});
  unlink(sb_.report_path().c_str());
  std::vector<std::string> argv = {AgentboxBin(), "run", "--report", sb_.report_path()};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.insert(argv.end(), {"--", "sh", "-c", script});
  nlohmann::json spec = {{"ip", FindTool("ip")},
                         {"addresses", {std::string(kAddr) + "/24", std::string(kOtherAddr) + "/24"}},
                         {"scratch", scratch},
                         {"run_dirs", run_dirs_},
                         {"binds", binds},
                         {"servers", servers_},
                         {"argv", argv}};
  WriteFile(scratch + "/netns-spec.json", spec.dump());
  Command c = sb_.AgentboxCommand({}, extra_env);
  c.argv = {Python(), scratch + "/with_netns.py", scratch + "/netns-spec.json"};
  c.timeout_ms = timeout_ms;
  RunResult r = RunCommand(c);
  if (auto text = ReadFile(sb_.report_path())) {
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (!j.is_discarded()) r.report = std::move(j);
  }
  return r;
}

std::string TestNetns::Log(const std::string& name) const {
  return ReadFile(sb_.scratch() + "/" + name + ".log").value_or("");
}

std::string NetnsError(const RunResult& r) {
  for (const auto& line : Lines(r.err)) {
    if (line.rfind("with-netns: ", 0) == 0) return line;
  }
  return "";
}

}  // namespace agentbox::e2e
