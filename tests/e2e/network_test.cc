// The egress proxy in `agentbox run`: listeners inside the sandbox's network
// namespace, served by the supervisor. The upstream is a small HTTP server
// on the host's 127.0.0.1 started by the test; nothing else is ever dialled.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "net_fixtures.h"
#include "linux/fd.h"

namespace agentbox::e2e {
namespace {

constexpr const char* kBody = HostServer::kBody;

// The proxy variables, without the NO_PROXY exemption for 127.0.0.1 (the
// test's upstream is on loopback, which the plan exempts by default).
const std::string kUseProxy = "NO_PROXY= no_proxy= ";

std::string PolicyFile(const Sandbox& sb, const std::string& network) {
  std::string path = sb.scratch() + "/policy.yaml";
  WriteFile(path, "version: 1\nmode: workspace-write\nnetwork:\n" + network);
  return path;
}

// ------------------------------------------------------------ host-side servers

// HTTPS/1.0 on 127.0.0.1 with the test CA's server certificate; answers
// "tls-hello sni=<name the client sent>" and prints "SERVED sni=<name>".
const char* const kTlsServer = R"PY(
import socket, ssl, sys, threading
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
seen = {}
def on_sni(sock, name, _ctx):
    seen[id(sock)] = name
ctx.sni_callback = on_sni
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(16)
print("PORT", srv.getsockname()[1], flush=True)
def serve(raw):
    try:
        raw.settimeout(10)
        with ctx.wrap_socket(raw, server_side=True) as s:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            sni = seen.get(id(s))
            body = ("tls-hello sni=%s\n" % sni).encode()
            s.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            print("SERVED sni=%s" % sni, flush=True)
    except Exception as e:
        print("FAILED", type(e).__name__, e, flush=True)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
)PY";

TEST(Network, AllowedThroughHttpProxyEnv) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  RunResult r = sb.Sh(kUseProxy + "curl -s " + server.url(), {"--allow-domain", server.target()});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, kBody)) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << r.Describe();
  const nlohmann::json* c = Connections(r);
  ASSERT_NE(c, nullptr) << r.Describe();
  EXPECT_EQ((*c)["allowed"], 1) << r.Describe();
  EXPECT_EQ((*c)["denied"], 0) << r.Describe();
  EXPECT_GT((*c)["bytes_down"].get<int>(), 0) << r.Describe();
  ASSERT_TRUE(r.report);
  const auto& net = (*r.report)["enforcement"]["facets"]["network"];
  EXPECT_EQ(net["level"], "full") << r.Describe();
  EXPECT_EQ(net["mechanisms"], nlohmann::json({"network-namespace", "connect-broker", "dns-inside", "egress-proxy"}))
      << r.Describe();
  EXPECT_EQ(server.served(), 1);
}

TEST(Network, NotAllowedIsA403AndASandboxDenial) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  std::string policy = PolicyFile(sb, "  egress_proxy: true\n");
  RunResult r = sb.Sh("out=$(" + kUseProxy + "curl -s -i " + server.url() +
                          "); echo \"$out\"; echo \"$out\" | grep -q '^HTTP/1.1 200'",
                      {"--policy", policy});
  EXPECT_EQ(r.status, 1) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "403")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "X-Agentbox-Denied")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, kBody)) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
  ASSERT_TRUE(r.report);
  bool found = false;
  for (const auto& d : (*r.report)["denials"]) {
    if (d["facet"] == "network" && d["op"] == "connect" && d["target"] == server.target() &&
        d["source"] == "proxy") {
      found = true;
      EXPECT_TRUE(Contains(d["reason"].get<std::string>(), "not-allowed")) << r.Describe();
      // on_violation.escalation: deny, the default: no offer.
      EXPECT_FALSE(d.contains("escalation")) << r.Describe();
    }
  }
  EXPECT_TRUE(found) << r.Describe();
  const nlohmann::json* c = Connections(r);
  ASSERT_NE(c, nullptr) << r.Describe();
  EXPECT_EQ((*c)["denied"], 1) << r.Describe();
  EXPECT_EQ(server.served(), 0);
}

// on_violation.escalation: one_time_approval: the proxy's denial carries the
// offer of the one grant that would have allowed it, the host and port as
// denied, held against on_violation.max_grant. Nothing is granted: the
// connection stays refused either way.
TEST(Network, DenialCarriesAnEscalationOfferHeldAgainstMaxGrant) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  for (bool covered : {true, false}) {
    SCOPED_TRACE(covered ? "max_grant covers the target" : "max_grant does not cover the target");
    Sandbox sb;
    const std::string ceiling = covered ? server.target() : "registry.example:443";
    const std::string policy = sb.scratch() + "/policy.yaml";
    WriteFile(policy, "version: 1\nmode: workspace-write\nnetwork:\n  egress_proxy: true\n"
                      "on_violation:\n  escalation: one_time_approval\n  max_grant:\n    network: [\"" +
                          ceiling + "\"]\n");
    RunResult r = sb.Sh("out=$(" + kUseProxy + "curl -s -i " + server.url() +
                            "); echo \"$out\"; echo \"$out\" | grep -q '^HTTP/1.1 200'",
                        {"--policy", policy});
    EXPECT_EQ(r.status, 1) << r.Describe();
    EXPECT_TRUE(Contains(r.out, "403")) << r.Describe();
    EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
    const nlohmann::json* d = DenialFor(r, server.target());
    ASSERT_NE(d, nullptr) << r.Describe();
    ASSERT_TRUE(d->contains("escalation")) << r.Describe();
    const nlohmann::json& e = (*d)["escalation"];
    EXPECT_EQ(e["grant"], nlohmann::json({{"network.allow", server.target()}})) << r.Describe();
    EXPECT_EQ(e["within_ceiling"], covered) << r.Describe();
    const std::string id = e.value("id", "");
    EXPECT_EQ(id.size(), 16u) << r.Describe();
    EXPECT_EQ(id.rfind("esc-", 0), 0u) << r.Describe();
    if (covered) {
      EXPECT_FALSE(e.contains("why_not")) << r.Describe();
    } else {
      EXPECT_TRUE(Contains(e.value("why_not", ""), "does not cover " + server.target())) << r.Describe();
    }
    EXPECT_EQ(server.served(), 0);
  }
}

TEST(Network, DirectConnectionBypassingTheProxyFails) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  RunResult r = sb.Sh("curl -s -m 5 --noproxy '*' " + server.url() + "; echo curl=$?",
                      {"--allow-domain", server.target()});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_FALSE(Contains(r.out, kBody)) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "curl=0")) << r.Describe();
  EXPECT_EQ(server.served(), 0);
}

TEST(Network, PythonUrllibThroughTheProxy) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  RunResult r = sb.Sh(kUseProxy + "python3 -c 'import urllib.request,sys; "
                                  "sys.stdout.write(urllib.request.urlopen(\"" + server.url() +
                          "\", timeout=10).read().decode())'",
                      {"--allow-domain", server.target()});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, kBody)) << r.Describe();
}

// Every connect() of a multi-threaded client (libuv, Go, Java) comes from
// a thread other than the main one; through the proxy it gets where the
// main thread's would, and a direct dial finds only the sandbox's loopback.
TEST(Network, ConnectsFromAWorkerThreadReachTheProxy) {
  ASSERT_FALSE(Python().empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  WriteFile(sb.ws() + "/threaded.py", kThreadedClient);
  RunResult r = sb.RunArgv({"python3", "threaded.py", server.url(), server.target()},
                           {"--allow-domain", server.target()});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(Lines(r.out), (std::vector<std::string>{std::string("fetch ") + kBody, "direct errno=111"}))
      << r.Describe();
  EXPECT_EQ(server.served(), 1);
  const nlohmann::json* c = Connections(r);
  ASSERT_NE(c, nullptr) << r.Describe();
  EXPECT_EQ((*c)["allowed"], 1) << r.Describe();
}

TEST(Network, Socks5WithRemoteNames) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  RunResult r = sb.Sh("curl -s --noproxy '' --socks5-hostname 127.0.0.1:1080 " + server.url(),
                      {"--allow-domain", server.target()});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, kBody)) << r.Describe();
  const nlohmann::json* c = Connections(r);
  ASSERT_NE(c, nullptr) << r.Describe();
  EXPECT_EQ((*c)["allowed"], 1) << r.Describe();
}

TEST(Network, NetworkLogHasOneJsonLinePerConnection) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  std::string log = sb.scratch() + "/net.jsonl";
  RunResult r = sb.Sh(kUseProxy + "curl -s " + server.url() + "; " + kUseProxy + "curl -s " +
                          "http://127.0.0.1:1/ ; true",
                      {"--allow-domain", server.target(), "--network-log", log});
  EXPECT_EQ(r.status, 0) << r.Describe();
  auto text = ReadFile(log);
  ASSERT_TRUE(text) << r.Describe();
  auto lines = Lines(*text);
  ASSERT_EQ(lines.size(), 2u) << *text;
  auto first = nlohmann::json::parse(lines[0], nullptr, false);
  auto second = nlohmann::json::parse(lines[1], nullptr, false);
  ASSERT_FALSE(first.is_discarded()) << *text;
  ASSERT_FALSE(second.is_discarded()) << *text;
  EXPECT_EQ(first["decision"], "allow") << *text;
  EXPECT_EQ(first["port"], server.port()) << *text;
  EXPECT_EQ(second["decision"], "deny") << *text;
  EXPECT_EQ(second["port"], 1) << *text;
}

// on_unknown_domain: ask consults --ask-command (on the host, with the
// target on stdin); a yes cannot admit a loopback address, which only an IP
// entry in network.allow does, so the connection is still refused.
TEST(Network, AskCommandIsConsulted) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  std::string policy = PolicyFile(sb, "  on_unknown_domain: ask\n");
  std::string asked = sb.scratch() + "/asked.json";
  std::string ask = sb.scratch() + "/ask.sh";
  WriteFile(ask, "#!/bin/sh\ncat > '" + asked + "'\necho allow\n", 0755);
  RunResult r = sb.Sh(kUseProxy + "curl -s " + server.url() + "; true", {"--policy", policy, "--ask-command", ask});
  EXPECT_EQ(r.status, 0) << r.Describe();
  auto question = ReadFile(asked);
  ASSERT_TRUE(question) << r.Describe();
  EXPECT_TRUE(Contains(*question, "\"port\":" + std::to_string(server.port()))) << *question;
  EXPECT_TRUE(HasDenial(r, server.target())) << r.Describe();
  EXPECT_EQ(server.served(), 0);
}

// The ask command runs on the host while the sandbox's connection is open:
// it gets stdin, stdout and stderr, and no descriptor of agentbox's (the
// sandbox's client connection above all).
TEST(Network, AskCommandGetsOnlyStdio) {
  ASSERT_FALSE(Python().empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  std::string policy = PolicyFile(sb, "  on_unknown_domain: ask\n");
  std::string fds = sb.scratch() + "/fds.txt";
  std::string ask = sb.scratch() + "/ask.sh";
  // The listing's own descriptor is closed again by the time the check runs.
  WriteFile(ask,
            "#!/bin/sh\nexec " + Python() +
                " -I -c '\nimport os\nfds = sorted(int(f) for f in os.listdir(\"/proc/self/fd\"))\n"
                "def is_open(fd):\n    try:\n        os.fstat(fd)\n        return True\n    except OSError:\n"
                "        return False\nlisted = \" \".join(str(f) for f in fds if is_open(f))\n"
                "open(\"" + fds + "\", \"w\").write(listed)\n"
                "print(\"deny\")\n'\n",
            0755);
  RunResult r = sb.Sh(kUseProxy + "curl -s " + server.url() + "; true", {"--policy", policy, "--ask-command", ask});
  EXPECT_EQ(r.status, 0) << r.Describe();
  auto listed = ReadFile(fds);
  ASSERT_TRUE(listed) << r.Describe();
  EXPECT_EQ(*listed, "0 1 2");
  EXPECT_TRUE(HasDenial(r, server.target())) << r.Describe();
}

// A sandbox cannot make the host run an ask command per connection: 50
// connections at once to 25 unknown targets (each twice) start at most 4
// commands at a time, one per target.
TEST(Network, AskCommandsAreBoundedAndOnePerTarget) {
  Sandbox sb;
  std::string policy = PolicyFile(sb, "  on_unknown_domain: ask\n");
  const std::string live = sb.scratch() + "/live", log = sb.scratch() + "/asked", peak = sb.scratch() + "/peak";
  ASSERT_EQ(mkdir(live.c_str(), 0700), 0);
  std::string ask = sb.scratch() + "/ask.sh";
  // Marks itself live, notes how many are live, unmarks itself before
  // answering. Two seconds for the same target's second connection to join
  // the open question: one curl opens both at once (-Z), as two curls
  // started one after the other on a loaded machine could be seconds apart.
  WriteFile(ask,
            "#!/bin/sh\nread q\necho \"$q\" >> '" + log + "'\ntouch '" + live + "/'$$\nls '" + live +
                "' | wc -l >> '" + peak + "'\nsleep 2\nrm -f '" + live + "/'$$\necho deny\n",
            0755);
  std::string script = "for i in $(seq 25); do " + kUseProxy +
                       "curl -s -Z --parallel-immediate -w '%{http_code}\\n' -o /dev/null -o /dev/null "
                       "http://host$i.test/ http://host$i.test/ & done; wait";
  RunResult r = sb.Sh(script, {"--policy", policy, "--ask-command", ask, "--ask-timeout", "30s"}, {}, 120000);
  EXPECT_EQ(r.status, 0) << r.Describe();
  int refused = 0;
  for (std::size_t at = r.out.find("403"); at != std::string::npos; at = r.out.find("403", at + 1)) ++refused;
  EXPECT_EQ(refused, 50) << r.Describe();
  auto asked = ReadFile(log);
  ASSERT_TRUE(asked) << r.Describe();
  std::vector<std::string> lines;
  for (std::size_t start = 0, nl; (nl = asked->find('\n', start)) != std::string::npos; start = nl + 1) {
    lines.push_back(asked->substr(start, nl - start));
  }
  EXPECT_EQ(lines.size(), 25u) << *asked;
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(std::unique(lines.begin(), lines.end()), lines.end()) << "a target was asked twice:\n" << *asked;
  int most = 0;
  auto peaks = ReadFile(peak);
  ASSERT_TRUE(peaks);
  for (std::size_t start = 0, nl; (nl = peaks->find('\n', start)) != std::string::npos; start = nl + 1) {
    most = std::max(most, std::atoi(peaks->substr(start, nl - start).c_str()));
  }
  EXPECT_GE(most, 1);
  EXPECT_LE(most, 4) << "ask commands running at once";
}

TEST(Network, UnknownDomainWithoutAskCommandIsDenied) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  std::string policy = PolicyFile(sb, "  on_unknown_domain: ask\n");
  RunResult r = sb.Sh(kUseProxy + "curl -s -o /dev/null -w '%{http_code}' " + server.url(), {"--policy", policy});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "403")) << r.Describe();
  EXPECT_TRUE(HasDenial(r, server.target())) << r.Describe();
}

// ------------------------------------------------------------ TLS through CONNECT

// tls.test and 127.0.0.1 at the server's port (the address guard admits a
// loopback address only through an IP entry), with the SNI check on that
// port (the test server cannot listen on 443).
std::string TlsPolicy(const Sandbox& sb, int port, const std::string& sni_check) {
  const std::string p = std::to_string(port);
  return PolicyFile(sb, "  allow: [\"tls.test:" + p + "\", \"127.0.0.1:" + p + "\"]\n  tls_sni_check: " + sni_check +
                            "\n  tls_sni_ports: [" + p + "]\n");
}

const char* const kTlsHosts = "127.0.0.1 tls.test front.test\n";

TEST(Network, HttpsThroughConnectWithATestCa) {
  ASSERT_FALSE(Python().empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  Sandbox sb;
  TestCa ca(sb.scratch());
  ASSERT_TRUE(ca.ok) << ca.log;
  HostScript tls(sb, "tls_server.py", kTlsServer, {ca.server_pem, ca.server_key});
  ASSERT_GT(tls.port(), 0) << tls.Output();
  WriteFile(sb.ws() + "/ca.pem", ReadFile(ca.ca_pem).value_or(""));
  const std::string url = "https://tls.test:" + std::to_string(tls.port()) + "/";
  RunResult r = RunWithHosts(sb, kTlsHosts, "curl -sS --max-time 20 --cacert ca.pem " + url,
                             {"--policy", TlsPolicy(sb, tls.port(), "true")});
  EXPECT_EQ(r.status, 0) << r.Describe() << tls.Output();
  EXPECT_TRUE(Contains(r.out, "tls-hello sni=tls.test")) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << r.Describe();
  const nlohmann::json* c = Connections(r);
  ASSERT_NE(c, nullptr) << r.Describe();
  EXPECT_EQ((*c)["allowed"], 1) << r.Describe();
  EXPECT_EQ((*c)["denied"], 0) << r.Describe();
}

// Domain fronting: a tunnel to the allowed tls.test carrying TLS for
// front.test (which the certificate also covers, as a CDN's would).
std::string FrontedCurl(int port) {
  const std::string p = std::to_string(port);
  return "curl -sS --max-time 20 --cacert ca.pem --connect-to front.test:" + p + ":tls.test:" + p +
         " https://front.test:" + p + "/";
}

TEST(Network, TlsSniMismatchIsRefused) {
  ASSERT_FALSE(Python().empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  Sandbox sb;
  TestCa ca(sb.scratch());
  ASSERT_TRUE(ca.ok) << ca.log;
  HostScript tls(sb, "tls_server.py", kTlsServer, {ca.server_pem, ca.server_key});
  ASSERT_GT(tls.port(), 0) << tls.Output();
  WriteFile(sb.ws() + "/ca.pem", ReadFile(ca.ca_pem).value_or(""));
  RunResult r = RunWithHosts(sb, kTlsHosts, FrontedCurl(tls.port()), {"--policy", TlsPolicy(sb, tls.port(), "true")});
  EXPECT_NE(r.status, 0) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "tls-hello")) << r.Describe();
  // The client's TLS library names the refusal: a fatal access_denied alert.
  EXPECT_TRUE(Contains(r.err, "access denied")) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
  const std::string target = "tls.test:" + std::to_string(tls.port());
  const nlohmann::json* d = DenialFor(r, target);
  ASSERT_NE(d, nullptr) << r.Describe();
  const std::string reason = (*d)["reason"].get<std::string>();
  EXPECT_TRUE(Contains(reason, "sni-mismatch")) << reason;
  EXPECT_TRUE(Contains(reason, "front.test")) << reason;
  EXPECT_FALSE(Contains(tls.Output(), "SERVED")) << tls.Output();
}

TEST(Network, TlsSniCheckSwitchedOffLetsAMismatchThrough) {
  ASSERT_FALSE(Python().empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  Sandbox sb;
  TestCa ca(sb.scratch());
  ASSERT_TRUE(ca.ok) << ca.log;
  HostScript tls(sb, "tls_server.py", kTlsServer, {ca.server_pem, ca.server_key});
  ASSERT_GT(tls.port(), 0) << tls.Output();
  WriteFile(sb.ws() + "/ca.pem", ReadFile(ca.ca_pem).value_or(""));
  RunResult r =
      RunWithHosts(sb, kTlsHosts, FrontedCurl(tls.port()), {"--policy", TlsPolicy(sb, tls.port(), "false")});
  EXPECT_EQ(r.status, 0) << r.Describe() << tls.Output();
  EXPECT_TRUE(Contains(r.out, "tls-hello sni=front.test")) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << r.Describe();
}

// ------------------------------------------------------------ the address guard, with the real resolver

// The supervisor resolves guarded.test through its /etc/hosts to 127.0.0.1:
// allowed by name only, the guard refuses; an IP entry admits it.
TEST(Network, NameResolvingToLoopbackNeedsAnIpEntry) {
  ASSERT_FALSE(Python().empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  const std::string p = std::to_string(server.port());
  const std::string hosts = "127.0.0.1 guarded.test\n";
  const std::string curl = "curl -s -i --max-time 20 http://guarded.test:" + p + "/";
  RunResult denied = RunWithHosts(sb, hosts, curl, {"--allow-domain", "guarded.test:" + p});
  EXPECT_TRUE(Contains(denied.out, "403")) << denied.Describe();
  EXPECT_TRUE(Contains(denied.out, "X-Agentbox-Denied: address-guard")) << denied.Describe();
  EXPECT_FALSE(Contains(denied.out, kBody)) << denied.Describe();
  const nlohmann::json* d = DenialFor(denied, "guarded.test:" + p);
  ASSERT_NE(d, nullptr) << denied.Describe();
  EXPECT_TRUE(Contains((*d)["reason"].get<std::string>(), "address-guard")) << denied.Describe();
  EXPECT_EQ(server.served(), 0);

  RunResult allowed =
      RunWithHosts(sb, hosts, curl, {"--allow-domain", "guarded.test:" + p, "--allow-domain", "127.0.0.1:" + p});
  EXPECT_EQ(allowed.status, 0) << allowed.Describe();
  EXPECT_TRUE(Contains(allowed.out, kBody)) << allowed.Describe();
  EXPECT_EQ(server.served(), 1);
}

// ------------------------------------------------------------ real clients

TEST(Network, GitCloneOverSmartHttp) {
  ASSERT_FALSE(Python().empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  Sandbox sb;
  const std::string root = sb.scratch() + "/git";
  const std::string marker = "cloned-through-the-proxy-" + RandomHex();
  MakeDirs(root + "/src");
  WriteFile(root + "/src/README", marker + "\n");
  ASSERT_EQ(sb.Git({"init", "-q"}, root + "/src").status, 0);
  ASSERT_EQ(sb.Git({"add", "README"}, root + "/src").status, 0);
  RunResult commit = sb.Git({"-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "one"},
                            root + "/src");
  ASSERT_EQ(commit.status, 0) << commit.Describe();
  ASSERT_EQ(sb.Git({"clone", "-q", "--bare", root + "/src", root + "/repo.git"}).status, 0);
  HostScript git(sb, "git_server.py", kGitServer, {root});
  ASSERT_GT(git.port(), 0) << git.Output();

  RunResult r = sb.Sh(kUseProxy + "git clone -q http://" + git.target() + "/repo.git clone && cat clone/README",
                      {"--allow-domain", git.target()}, {}, 60000);
  EXPECT_EQ(r.status, 0) << r.Describe() << git.Output();
  EXPECT_TRUE(Contains(r.out, marker)) << r.Describe();
  EXPECT_TRUE(Contains(git.Output("git-upload-pack 200", 5000), "POST /repo.git/git-upload-pack 200")) << git.Output();
  const nlohmann::json* c = Connections(r);
  ASSERT_NE(c, nullptr) << r.Describe();
  EXPECT_GE((*c)["allowed"].get<int>(), 2) << r.Describe();  // ref advertisement, then the pack
  EXPECT_EQ((*c)["denied"], 0) << r.Describe();
}

// Node 20: http.request with an absolute URI to the proxy (plain HTTP, as
// npm's agent does) and CONNECT then tls.connect (HTTPS) work; the built-in
// fetch ignores HTTP_PROXY and, dialling directly, reaches nothing.
const char* const kNodeClient = R"JS(
const http = require("http"), tls = require("tls"), fs = require("fs");
const proxy = new URL(process.env.HTTP_PROXY);
const [plainTarget, tlsTarget] = process.argv.slice(2);
function viaProxy(options) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: proxy.hostname, port: proxy.port, ...options });
    req.on("error", reject);
    req.on("response", (res) => {
      let body = "";
      res.on("data", (d) => (body += d));
      res.on("end", () => resolve(res.statusCode + " " + body.trim()));
    });
    req.on("connect", (res, socket) => resolve({ res, socket }));
    req.end();
  });
}
(async () => {
  console.log("plain " + (await viaProxy({ path: "http://" + plainTarget + "/", headers: { host: plainTarget } })));
  const { res, socket } = await viaProxy({ method: "CONNECT", path: tlsTarget });
  const body = await new Promise((resolve, reject) => {
    const s = tls.connect({ socket, host: "127.0.0.1", ca: fs.readFileSync("ca.pem") }, () =>
      s.write("GET / HTTP/1.0\r\nHost: " + tlsTarget + "\r\n\r\n"));
    let data = "";
    s.on("data", (d) => (data += d));
    s.on("end", () => resolve(data.split("\r\n\r\n")[1].trim()));
    s.on("error", reject);
  });
  console.log("tunnel " + res.statusCode + " " + body);
  try {
    await fetch("http://" + plainTarget + "/");
    console.log("fetch reached the server");
  } catch (e) {
    console.log("fetch failed " + (e.cause && e.cause.code));
  }
})().catch((e) => { console.log("error " + e.message); process.exit(1); });
)JS";

TEST(Network, NodeThroughTheProxy) {
  ASSERT_FALSE(FindTool("node").empty()) << "node is missing (scripts/install-deps.sh installs it)";
  ASSERT_FALSE(Python().empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  HostServer plain;
  ASSERT_GT(plain.port(), 0);
  Sandbox sb;
  TestCa ca(sb.scratch());
  ASSERT_TRUE(ca.ok) << ca.log;
  HostScript tls(sb, "tls_server.py", kTlsServer, {ca.server_pem, ca.server_key});
  ASSERT_GT(tls.port(), 0) << tls.Output();
  WriteFile(sb.ws() + "/ca.pem", ReadFile(ca.ca_pem).value_or(""));
  WriteFile(sb.ws() + "/client.js", kNodeClient);
  RunResult r = sb.Sh(kUseProxy + "node client.js " + plain.target() + " " + tls.target(),
                      {"--allow-domain", plain.target(), "--allow-domain", tls.target()});
  EXPECT_EQ(r.status, 0) << r.Describe() << tls.Output();
  EXPECT_TRUE(Contains(r.out, std::string("plain 200 ") + kBody)) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "tunnel 200 tls-hello sni=None")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "fetch failed ECONNREFUSED")) << r.Describe();
  EXPECT_EQ(plain.served(), 1);  // the absolute-URI request only; fetch reached nothing
  const nlohmann::json* c = Connections(r);
  ASSERT_NE(c, nullptr) << r.Describe();
  EXPECT_EQ((*c)["allowed"], 2) << r.Describe();
}

// ------------------------------------------------------------ bypassing the proxy

// A UDP socket on the host's 127.0.0.1 receives nothing the sandbox sends
// to that port: the sandbox's loopback is its own.
TEST(Network, UdpToAHostLoopbackPortArrivesNowhere) {
  ASSERT_FALSE(Python().empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  linux::UniqueFd udp(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  const int u = udp.get();
  ASSERT_GE(u, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(u, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(getsockname(u, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  // Control: from the host, a datagram does arrive.
  ASSERT_EQ(sendto(u, "c", 1, 0, reinterpret_cast<sockaddr*>(&a), sizeof a), 1);
  char buf[64];
  pollfd p = {u, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 2000), 1);
  ASSERT_EQ(recv(u, buf, sizeof buf, 0), 1);

  Sandbox sb;
  RunResult r = sb.RunArgv({"python3", "-c",
                            "import socket\n"
                            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                            "for i in range(5):\n"
                            "    try:\n"
                            "        s.sendto(b'from-the-sandbox', ('127.0.0.1', " + std::to_string(port) + "))\n"
                            "    except OSError as e:\n"
                            "        print('error', e.errno)\n"
                            "print('sent')\n"},
                           {"--allow-domain", "127.0.0.1:" + std::to_string(port)});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "sent")) << r.Describe();
  // Loopback delivery happens inside sendto: had anything arrived, it would be queued now.
  EXPECT_EQ(recv(u, buf, sizeof buf, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN);
}

// Runs argv[2:] in new mount and network namespaces (and, when not root, a
// user namespace mapping only the caller's own ids) standing in for the
// host: argv[1] is bound over /etc/resolv.conf, and this process holds a
// "resolver" on that host's 127.0.0.1:53, UDP and TCP. After the command it
// prints how many queries and connections the resolver got.
const char* const kWithResolver = R"PY(
import ctypes, fcntl, os, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
resolv, argv = sys.argv[1], sys.argv[2:]
uid, gid = os.getuid(), os.getgid()
CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWUSER = 0x20000, 0x40000000, 0x10000000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 1 << 18
def check(rc, what):
    if rc != 0:
        sys.exit("with-resolver: %s: %s" % (what, os.strerror(ctypes.get_errno())))
check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | (0 if uid == 0 else CLONE_NEWUSER)), "unshare")
if uid != 0:
    for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)), ("gid_map", "%d %d 1" % (gid, gid))):
        with open("/proc/self/" + name, "w") as f:
            f.write(text)
check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
check(libc.mount(resolv.encode(), b"/etc/resolv.conf", None, MS_BIND, None), "bind " + resolv)
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # lo up: IFF_UP | IFF_LOOPBACK | IFF_RUNNING
    fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", 0x1 | 0x8 | 0x40, b""))
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", 53))
tcp = socket.socket()
tcp.bind(("127.0.0.1", 53))
tcp.listen(8)
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # control: the resolver hears the host
    probe.sendto(b"control", ("127.0.0.1", 53))
    udp.settimeout(5)
    assert udp.recv(64) == b"control"
print("resolver listening", flush=True)
pid = os.fork()
if pid == 0:
    os.execv(argv[0], argv)
status = os.waitpid(pid, 0)[1]
heard = 0
udp.setblocking(False)
tcp.setblocking(False)
for receive in (lambda: udp.recv(4096), lambda: tcp.accept()):
    try:
        while True:
            receive()
            heard += 1
    except BlockingIOError:
        pass
print("resolver heard %d" % heard, flush=True)
sys.exit(os.waitstatus_to_exitcode(status))
)PY";

// The sandbox's DNS is the supervisor's: the host's /etc/resolv.conf does
// not reach inside, and the resolver on the host's 127.0.0.1:53 hears only
// the supervisor's own lookups of allowed names (this one never answers),
// never a query of the sandbox's; a name nothing allows is refused without
// asking it, and reported.
TEST(Network, NameResolutionInsideFailsAndSendsNothing) {
  ASSERT_FALSE(Python().empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  Sandbox sb;
  WriteFile(sb.scratch() + "/resolv.conf", "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n");
  WriteFile(sb.scratch() + "/with_resolver.py", kWithResolver);
  const std::string script =
      "cat /etc/resolv.conf; getent hosts resolve-me.test; echo getent=$?; "
      "python3 -c 'import socket\ntry:\n  socket.getaddrinfo(\"resolve-me.test\", 80)\n  print(\"resolved\")\n"
      "except socket.gaierror as e:\n  print(\"gaierror\", e.errno)'";
  for (const std::vector<std::string>& options :
       {std::vector<std::string>{}, std::vector<std::string>{"--allow-domain", "resolve-me.test"}}) {
    Command c = sb.AgentboxCommand({});
    c.argv = {Python(), sb.scratch() + "/with_resolver.py", sb.scratch() + "/resolv.conf", AgentboxBin(), "run",
              "--report", sb.report_path()};
    c.argv.insert(c.argv.end(), options.begin(), options.end());
    c.argv.insert(c.argv.end(), {"--", "sh", "-c", script});
    unlink(sb.report_path().c_str());
    RunResult r = RunCommand(c);
    if (auto text = ReadFile(sb.report_path())) {
      auto j = nlohmann::json::parse(*text, nullptr, false);
      if (!j.is_discarded()) r.report = std::move(j);
    }
    EXPECT_EQ(r.status, 0) << r.Describe();
    EXPECT_TRUE(Contains(r.out, "resolver listening")) << r.Describe();
    EXPECT_TRUE(Contains(r.out, "nameserver 127.0.0.1")) << r.Describe();
    EXPECT_FALSE(Contains(r.out, "getent=0")) << r.Describe();
    EXPECT_TRUE(Contains(r.out, "gaierror")) << r.Describe();
    EXPECT_FALSE(Contains(r.out, "resolved\n")) << r.Describe();
    if (options.empty()) {
      EXPECT_TRUE(Contains(r.out, "resolver heard 0")) << r.Describe();
      ASSERT_TRUE(r.report) << r.Describe();
      const nlohmann::json* d = DenialFor(r, "resolve-me.test");
      ASSERT_NE(d, nullptr) << r.Describe();
      EXPECT_EQ((*d)["op"], "dns") << r.Describe();
      EXPECT_NE((*d)["reason"].get<std::string>().find("networking is off by policy"), std::string::npos)
          << r.Describe();
    } else {
      EXPECT_FALSE(Contains(r.out, "resolver heard 0")) << r.Describe();  // the supervisor asked
    }
  }
}

// ------------------------------------------------------------ asking on the terminal

// `argv` on a new pseudo-terminal, which is its controlling terminal and its
// stdin, stdout and stderr; the test plays the person at the keyboard.
class PtyRun {
 public:
  PtyRun(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& cwd) {
    master_ = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master_ < 0 || grantpt(master_) != 0 || unlockpt(master_) != 0) return;
    const std::string slave = ptsname(master_);
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      // A new session whose controlling terminal is the pty; the child
      // leads its foreground process group.
      setsid();
      int fd = open(slave.c_str(), O_RDWR);
      if (fd < 0 || ioctl(fd, TIOCSCTTY, 0) != 0) _exit(120);
      if (dup2(fd, 0) < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(121);
      if (fd > 2) close(fd);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      if (chdir(cwd.c_str()) != 0) _exit(122);
      execve(args[0], args.data(), envp.data());
      _exit(123);
    }
  }
  ~PtyRun() {
    if (pid_ > 0 && !reaped_) {
      kill(-pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (master_ >= 0) close(master_);
  }
  bool started() const { return pid_ > 0; }

  // Reads until `needle` appears after what earlier calls consumed; moves past it.
  bool Expect(const std::string& needle, int timeout_ms = 20000) {
    const long deadline = NowMs() + timeout_ms;
    for (;;) {
      std::size_t at = text_.find(needle, cursor_);
      if (at != std::string::npos) {
        cursor_ = at + needle.size();
        return true;
      }
      long left = deadline - NowMs();
      if (left <= 0 || !ReadSome(static_cast<int>(left))) return false;
    }
  }
  void Type(const std::string& keys) { (void)!write(master_, keys.data(), keys.size()); }
  // Reads to the end, then the exit status (or -1).
  int Wait(int timeout_ms = 30000) {
    const long deadline = NowMs() + timeout_ms;
    while (NowMs() < deadline && ReadSome(static_cast<int>(deadline - NowMs()))) {
    }
    int status = 0;
    if (waitpid(pid_, &status, 0) != pid_) return -1;
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  const std::string& text() const { return text_; }
  // Occurrences of `needle` in everything read so far.
  int Count(const std::string& needle) const {
    int n = 0;
    for (std::size_t at = text_.find(needle); at != std::string::npos; at = text_.find(needle, at + 1)) ++n;
    return n;
  }

 private:
  // False at the end (EIO once the last slave fd is closed) or timeout.
  bool ReadSome(int timeout_ms) {
    pollfd p = {master_, POLLIN, 0};
    if (poll(&p, 1, std::min(timeout_ms, 1000)) < 0) return false;
    if (!(p.revents & (POLLIN | POLLHUP))) return timeout_ms > 1000;
    char buf[4096];
    ssize_t n = read(master_, buf, sizeof buf);
    if (n <= 0) return false;
    text_.append(buf, static_cast<std::size_t>(n));
    return true;
  }
  int master_ = -1;
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::string text_;
  std::size_t cursor_ = 0;
};

// curl printing "<label>: <status>" for http://<host>:<port>/.
std::string Fetch(const std::string& label, const std::string& host, int port) {
  return kUseProxy + "curl -s -o /dev/null -w '" + label + ": %{http_code}\\n' http://" + host + ":" +
         std::to_string(port) + "/";
}

// Fetches ask.test `times` times in sequence.
std::string FetchAsk(int port, int times) {
  std::string script;
  for (int i = 0; i < times; ++i) script += Fetch("fetch " + std::to_string(i), "ask.test", port) + "; ";
  return script;
}

// `agentbox run` with on_unknown_domain: ask on a terminal; ask.test resolves
// to 127.0.0.1, and the 127.0.0.1:PORT entry lets a yes through the address
// guard. `prefix` goes before agentbox's argv (as an exec chain).
struct TerminalAsk {
  TerminalAsk(const Sandbox& sb, int port, const std::string& script, const std::vector<std::string>& extra = {},
              const std::vector<std::string>& prefix = {}) {
    const std::string p = std::to_string(port);
    WriteFile(sb.scratch() + "/hosts", "127.0.0.1 ask.test\n");
    WriteFile(sb.scratch() + "/with_binds.py", kWithBinds);
    std::string policy = PolicyFile(sb, "  allow: [\"127.0.0.1:" + p + "\"]\n  on_unknown_domain: ask\n");
    unlink(sb.report_path().c_str());
    std::vector<std::string> argv = prefix;
    argv.insert(argv.end(), {Python(), sb.scratch() + "/with_binds.py", sb.scratch() + "/hosts", "/etc/hosts", "--",
                             AgentboxBin(), "run", "--report", sb.report_path(), "--policy", policy});
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), {"--", "sh", "-c", script});
    run = std::make_unique<PtyRun>(argv, sb.Env({"TERM=dumb"}), sb.ws());
    question = "allow ask.test:" + p + "? [o]nce / [a]lways this run / [d]eny: ";
  }
  std::optional<nlohmann::json> Report(const Sandbox& sb) const {
    auto text = ReadFile(sb.report_path());
    if (!text) return std::nullopt;
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_discarded()) return std::nullopt;
    return j;
  }
  std::unique_ptr<PtyRun> run;
  std::string question;
};

TEST(Network, TerminalAskOnceThenDeny) {
  ASSERT_FALSE(Python().empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  TerminalAsk ask(sb, server.port(), FetchAsk(server.port(), 2));
  ASSERT_TRUE(ask.run->started());
  ASSERT_TRUE(ask.run->Expect(ask.question)) << ask.run->text();
  ask.run->Type("o\n");
  ASSERT_TRUE(ask.run->Expect("fetch 0: 200")) << ask.run->text();
  // "once" was for that connection only: the next one asks again.
  ASSERT_TRUE(ask.run->Expect(ask.question)) << ask.run->text();
  ask.run->Type("d\n");
  ASSERT_TRUE(ask.run->Expect("fetch 1: 403")) << ask.run->text();
  EXPECT_EQ(ask.run->Wait(), 0) << ask.run->text();
  EXPECT_EQ(server.served(), 1);
  auto report = ask.Report(sb);
  ASSERT_TRUE(report) << ask.run->text();
  EXPECT_EQ((*report)["network"]["connections"]["allowed"], 1) << report->dump();
  EXPECT_EQ((*report)["network"]["connections"]["denied"], 1) << report->dump();
  bool named = false;
  for (const auto& d : (*report)["denials"]) {
    if (d["target"] == "ask.test:" + std::to_string(server.port()) &&
        Contains(d["reason"].get<std::string>(), "ask-denied")) {
      named = true;
    }
  }
  EXPECT_TRUE(named) << report->dump();
}

TEST(Network, TerminalAskAlwaysHoldsForTheRun) {
  ASSERT_FALSE(Python().empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  TerminalAsk ask(sb, server.port(), FetchAsk(server.port(), 3));
  ASSERT_TRUE(ask.run->started());
  ASSERT_TRUE(ask.run->Expect(ask.question)) << ask.run->text();
  ask.run->Type("a\n");
  ASSERT_TRUE(ask.run->Expect("fetch 2: 200")) << ask.run->text();
  EXPECT_EQ(ask.run->Wait(), 0) << ask.run->text();
  EXPECT_EQ(ask.run->Count(ask.question), 1) << ask.run->text();
  EXPECT_TRUE(Contains(ask.run->text(), "fetch 0: 200")) << ask.run->text();
  EXPECT_TRUE(Contains(ask.run->text(), "fetch 1: 200")) << ask.run->text();
  EXPECT_EQ(server.served(), 3);
}

// Silence is a deny once the bound passes; so is anything but a yes.
TEST(Network, TerminalAskUnansweredIsADeny) {
  ASSERT_FALSE(Python().empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  TerminalAsk ask(sb, server.port(), FetchAsk(server.port(), 2), {"--ask-timeout", "1s"});
  ASSERT_TRUE(ask.run->started());
  ASSERT_TRUE(ask.run->Expect(ask.question)) << ask.run->text();
  ASSERT_TRUE(ask.run->Expect("no answer in time, denied")) << ask.run->text();
  ASSERT_TRUE(ask.run->Expect("fetch 0: 403")) << ask.run->text();
  ASSERT_TRUE(ask.run->Expect(ask.question)) << ask.run->text();
  ask.run->Type("sure\n");
  ASSERT_TRUE(ask.run->Expect("fetch 1: 403")) << ask.run->text();
  EXPECT_EQ(ask.run->Wait(), 0) << ask.run->text();
  EXPECT_EQ(server.served(), 0);
  auto report = ask.Report(sb);
  ASSERT_TRUE(report) << ask.run->text();
  EXPECT_EQ((*report)["network"]["connections"]["denied"], 2) << report->dump();
}

// While a question waits on the terminal, the proxy serves everything else.
TEST(Network, TerminalQuestionDoesNotHoldOtherConnections) {
  ASSERT_FALSE(Python().empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  // The direct fetches start only once the question is on the terminal: the
  // test says so by creating `go` in the workspace (shared with the host).
  const std::string script = "(" + FetchAsk(server.port(), 1) + ") & while [ ! -e go ]; do sleep 0.05; done; " +
                             Fetch("direct", "127.0.0.1", server.port()) + "; " + Fetch("again", "127.0.0.1", server.port()) +
                             "; wait";
  TerminalAsk ask(sb, server.port(), script);
  ASSERT_TRUE(ask.run->started());
  ASSERT_TRUE(ask.run->Expect(ask.question)) << ask.run->text();
  EXPECT_FALSE(Contains(ask.run->text(), "direct:")) << ask.run->text();
  WriteFile(sb.ws() + "/go", "");
  ASSERT_TRUE(ask.run->Expect("again: 200")) << ask.run->text();  // both served, the question still open
  EXPECT_FALSE(Contains(ask.run->text(), "fetch 0:")) << ask.run->text();
  ask.run->Type("o\n");
  ASSERT_TRUE(ask.run->Expect("fetch 0: 200")) << ask.run->text();
  EXPECT_EQ(ask.run->Wait(), 0) << ask.run->text();
  EXPECT_EQ(server.served(), 3);
}

// Runs argv[1:] in a new process group, not the terminal's foreground one;
// the child dies with this process (which the test can kill).
const char* const kInBackground = R"PY(
import ctypes, os, signal, sys
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    os.execv(sys.argv[1], sys.argv[1:])
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
)PY";

// In the background of its terminal (another process group is in the
// foreground) agentbox does not read the terminal, which would stop it: the
// question is a deny, at once, and nothing is printed there.
TEST(Network, TerminalAskInTheBackgroundIsADeny) {
  ASSERT_FALSE(Python().empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  TerminalAsk ask(sb, server.port(), FetchAsk(server.port(), 1), {}, {Python(), "-c", kInBackground});
  ASSERT_TRUE(ask.run->started());
  ASSERT_TRUE(ask.run->Expect("fetch 0: 403")) << ask.run->text();
  EXPECT_EQ(ask.run->Wait(), 0) << ask.run->text();
  EXPECT_EQ(ask.run->Count("allow ask.test"), 0) << ask.run->text();
  EXPECT_EQ(server.served(), 0);
}

// With --ask-command the program answers, not the terminal.
TEST(Network, AskCommandTakesPrecedenceOverTheTerminal) {
  ASSERT_FALSE(Python().empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  const std::string ask_prog = sb.scratch() + "/ask.sh";
  WriteFile(ask_prog, "#!/bin/sh\ncat >/dev/null\necho allow\n", 0755);
  TerminalAsk ask(sb, server.port(), FetchAsk(server.port(), 1), {"--ask-command", ask_prog});
  ASSERT_TRUE(ask.run->started());
  ASSERT_TRUE(ask.run->Expect("fetch 0: 200")) << ask.run->text();
  EXPECT_EQ(ask.run->Wait(), 0) << ask.run->text();
  EXPECT_EQ(ask.run->Count(ask.question), 0) << ask.run->text();
  EXPECT_EQ(server.served(), 1);
}

// ------------------------------------------------------------ wrap

// `agentbox wrap` with the proxy's flags, given relative paths in the
// workspace; the printed argv is then spawned the way a harness does, from
// another directory: the __exec side asks the command and writes the log.
TEST(Network, WrapCarriesAskCommandAndNetworkLog) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  std::string policy = PolicyFile(sb, "  allow: [\"" + server.target() + "\"]\n  on_unknown_domain: ask\n");
  WriteFile(sb.ws() + "/ask.sh", "#!/bin/sh\ncat > asked.json\necho deny\n", 0755);
  const std::string script = Fetch("known", "127.0.0.1", server.port()) + "; " + Fetch("unknown", "unknown.test", 80);
  RunResult w = RunCommand(sb.AgentboxCommand({"wrap", "--policy", policy, "--ask-command", "./ask.sh",
                                               "--ask-timeout", "20s", "--network-log", "net.jsonl", "--", "sh", "-c",
                                               script}));
  ASSERT_EQ(w.status, 0) << w.Describe();
  auto j = nlohmann::json::parse(w.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << w.Describe();
  const auto argv = j["argv"].get<std::vector<std::string>>();
  const std::vector<std::string> flags = {"--ask-command", sb.ws() + "/ask.sh", "--ask-timeout", "20s",
                                          "--network-log", sb.ws() + "/net.jsonl", "--"};
  ASSERT_GE(argv.size(), 2 + flags.size()) << w.out;
  EXPECT_EQ(std::vector<std::string>(argv.begin() + 2, argv.begin() + 2 + flags.size()), flags) << w.out;

  Command c;
  c.argv = argv;
  c.cwd = sb.scratch();
  c.env = sb.Env();
  for (auto it = j["env"].begin(); it != j["env"].end(); ++it) c.env.push_back(it.key() + "=" + it.value().get<std::string>());
  RunResult r = RunCommand(c);
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "known: 200")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "unknown: 403")) << r.Describe();
  // The ask command ran (in the directory the harness started the argv from).
  auto question = ReadFile(sb.scratch() + "/asked.json");
  ASSERT_TRUE(question) << r.Describe();
  EXPECT_TRUE(Contains(*question, "\"host\":\"unknown.test\"")) << *question;
  auto log = ReadFile(sb.ws() + "/net.jsonl");
  ASSERT_TRUE(log) << r.Describe();
  auto lines = Lines(*log);
  ASSERT_EQ(lines.size(), 2u) << *log;
  int allowed = 0, asked_and_denied = 0;
  for (const auto& line : lines) {
    auto rec = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(rec.is_discarded()) << line;
    allowed += rec["decision"] == "allow" && rec["port"] == server.port();
    asked_and_denied += rec["decision"] == "deny" && rec["reason"] == "ask-denied";
  }
  EXPECT_EQ(allowed, 1) << *log;
  EXPECT_EQ(asked_and_denied, 1) << *log;
  EXPECT_EQ(server.served(), 1);
}

TEST(Network, NoProxyWithoutNetworkNeeds) {
  Sandbox sb;
  RunResult r = sb.Sh("env | grep -ci _proxy; true");
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "0")) << r.Describe();
  ASSERT_TRUE(r.report);
  // No proxy, and nothing tried: the broker's summary is all zero.
  EXPECT_EQ((*r.report)["network"]["connections"],
            nlohmann::json({{"allowed", 0}, {"denied", 0}, {"errors", 0}, {"bytes_up", 0}, {"bytes_down", 0}}))
      << r.Describe();
}

}  // namespace
}  // namespace agentbox::e2e
