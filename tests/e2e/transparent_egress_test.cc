// Transparent egress: without any proxy variable, a program's own DNS
// lookups go to the supervisor's DNS inside the sandbox, and its own TCP
// connect()s past the sandbox's loopback are decided and opened by the
// supervisor (the connect() broker), each refusal a report denial.
//
// The servers live on a network of the test's own: 198.18.0.10 and
// 198.18.0.11 (the benchmarking range, on no real network) on an interface
// inside a network namespace made for the run (TestNetns), where agentbox
// runs too. Those addresses are not public, so every policy that admits a
// name also has an IP entry for its address (the address guard); the cases
// that test the name path leave the name out, or use another port. Nothing
// else is ever dialled.
#include <gtest/gtest.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness.h"
#include "net_fixtures.h"

namespace agentbox::e2e {
namespace {

constexpr const char* kAddr = TestNetns::kAddr;            // 198.18.0.10
constexpr const char* kOtherAddr = TestNetns::kOtherAddr;  // 198.18.0.11

// The supervisor's /etc/hosts. other.test shares api.test's address: only
// the name tells them apart.
const std::string kHosts = std::string(kAddr) + " api.test git.test ssh.test other.test\n" + kOtherAddr +
                           " evil.test\n";

// Every client runs without the proxy's variables: what reaches a server
// went through the DNS and the broker.
const std::string kNoProxy =
    "unset HTTP_PROXY HTTPS_PROXY ALL_PROXY http_proxy https_proxy all_proxy NO_PROXY no_proxy\n";

// Allowed by name, each with the IP entry the address guard needs.
const std::vector<std::string> kAllow = {"api.test:8080", "198.18.0.10:8080", "git.test:9418", "198.18.0.10:9418",
                                         "ssh.test:2222", "198.18.0.10:2222"};

constexpr int kRunMs = 120000;

std::string WritePolicy(const Sandbox& sb, const std::vector<std::string>& allow) {
  std::string yaml = "version: 1\nmode: workspace-write\n";
  if (!allow.empty()) {
    yaml += "network:\n  allow: [";
    for (size_t i = 0; i < allow.size(); ++i) yaml += (i ? ", \"" : "\"") + allow[i] + "\"";
    yaml += "]\n";
  }
  const std::string path = sb.scratch() + "/policy.yaml";
  WriteFile(path, yaml);
  return path;
}

// "" when every tool is there, else why this case cannot run here.
std::string Missing(const std::vector<std::string>& tools) {
  if (std::string why = TestNetns::WhyNot(); !why.empty()) return why;
  for (const auto& t : tools) {
    if (FindTool(t).empty()) return t + " is not installed";
  }
  return "";
}

// The report's network denial with `op` and `target`, or null.
const nlohmann::json* NetDenial(const RunResult& r, const std::string& op, const std::string& target) {
  if (!r.report || !(*r.report)["denials"].is_array()) return nullptr;
  for (const auto& d : (*r.report)["denials"]) {
    if (d["facet"] == "network" && d["op"] == op && d["target"] == target) return &d;
  }
  return nullptr;
}

std::vector<nlohmann::json> NetDenials(const RunResult& r) {
  std::vector<nlohmann::json> out;
  if (!r.report || !(*r.report)["denials"].is_array()) return out;
  for (const auto& d : (*r.report)["denials"]) {
    if (d["facet"] == "network") out.push_back(d);
  }
  return out;
}

int Allowed(const RunResult& r) {
  const nlohmann::json* c = Connections(r);
  return c && (*c)["allowed"].is_number_integer() ? (*c)["allowed"].get<int>() : -1;
}

// Lines of a server's log that start with `prefix`.
int CountLines(const std::string& log, const std::string& prefix) {
  int n = 0;
  for (const auto& line : Lines(log)) n += line.rfind(prefix, 0) == 0;
  return n;
}

std::vector<nlohmann::json> JsonLines(const std::string& path) {
  std::vector<nlohmann::json> out;
  for (const auto& line : Lines(ReadFile(path).value_or(""))) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded()) out.push_back(j);
  }
  return out;
}

std::string UserName() {
  const struct passwd* pw = getpwuid(getuid());
  return pw ? pw->pw_name : "";
}

// Compiles `source` (C) on the host into the workspace as `name`; the
// compiler's output when it fails.
std::string CompileC(const Sandbox& sb, const std::string& name, const std::string& source) {
  const std::string src = sb.scratch() + "/" + name + ".c";
  WriteFile(src, source);
  RunResult r = sb.Host({FindTool("cc"), "-O1", "-pthread", "-o", sb.ws() + "/" + name, src});
  return r.status == 0 ? "" : r.out + r.err;
}

// ------------------------------------------------------------------ clients

// getaddrinfo + connect, then one HTTP/1.0 request: what a C program does.
const char* const kNetClient = R"C(
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
int main(int argc, char** argv) {
  if (argc != 3) return 64;
  struct addrinfo hints, *res;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(argv[1], argv[2], &hints, &res);
  if (rc != 0) {
    printf("getaddrinfo: %s\n", gai_strerror(rc));
    return 2;
  }
  int err = 0;
  for (struct addrinfo* a = res; a; a = a->ai_next) {
    int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (s < 0) { err = errno; continue; }
    if (connect(s, a->ai_addr, a->ai_addrlen) != 0) { err = errno; close(s); continue; }
    char req[512];
    int n = snprintf(req, sizeof req, "GET /c HTTP/1.0\r\nHost: %s\r\n\r\n", argv[1]);
    if (write(s, req, n) != n) { perror("write"); return 4; }
    char buf[4096];
    ssize_t got;
    while ((got = read(s, buf, sizeof buf)) > 0) fwrite(buf, 1, got, stdout);
    return 0;
  }
  printf("connect: %s\n", strerror(err));
  return 3;
}
)C";

const char* const kNodeFetch = R"JS(
fetch(process.argv[2])
  .then(async (r) => { process.stdout.write(await r.text()); })
  .catch((e) => { const c = e.cause || e; console.log("node-error " + (c.code || c.message)); process.exitCode = 1; });
)JS";

const char* const kPythonClient = R"PY(
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    s = socket.create_connection((host, port), timeout=15)
except socket.gaierror as e:
    print("python-error gaierror", e)
    sys.exit(1)
except OSError as e:
    print("python-error errno", e.errno)
    sys.exit(1)
s.sendall(("GET /python HTTP/1.0\r\nHost: %s\r\n\r\n" % host).encode())
data = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
sys.stdout.write(data.decode())
)PY";

const std::string kHello = "hello from 198.18.0.10:8080";

// One kind of client: how it is run against HOST:PORT, what its output says
// when it got through, when the name did not resolve, and when the connect
// was refused (any of the alternatives).
struct Client {
  std::string name;
  std::vector<std::string> tools;
  std::string host;  // its allowed target
  int port;
  // Writes the files it needs in the workspace; "" or what failed.
  std::function<std::string(const Sandbox&)> prepare;
  std::function<std::string(const std::string& host, int port)> command;
  // The servers it talks to when allowed, and what its output then has.
  std::function<void(const Sandbox&, TestNetns&, std::vector<std::string>* expect)> serve;
  std::vector<std::string> unresolved, refused;
};

std::string SshCommand(const std::string& host, int port) {
  return "ssh -F /dev/null -i ./id_test -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=no "
         "-o UserKnownHostsFile=/dev/null -o GlobalKnownHostsFile=/dev/null -o ConnectTimeout=20 -o LogLevel=ERROR "
         "-p " + std::to_string(port) + " " + UserName() + "@" + host + " echo ssh-ok 2>&1; rc=$?; echo \"rc=$rc\"";
}

void ServeHttp(const Sandbox&, TestNetns& net, std::vector<std::string>* expect) {
  net.AddPythonServer("web", {"tcp:198.18.0.10:8080"});
  *expect = {kHello, "rc=0"};
}

std::string NoFiles(const Sandbox&) { return ""; }

const std::vector<Client>& Clients() {
  static const std::vector<Client> clients = {
      {"curl", {"curl"}, "api.test", 8080, NoFiles,
       [](const std::string& h, int p) {
         return "curl -sS -m 20 http://" + h + ":" + std::to_string(p) + "/curl 2>&1; rc=$?; echo \"rc=$rc\"";
       },
       ServeHttp, {"rc=6", "Could not resolve host"}, {"rc=7"}},
      {"node", {"node"}, "api.test", 8080,
       [](const Sandbox& sb) {
         WriteFile(sb.ws() + "/fetch.js", kNodeFetch);
         return std::string();
       },
       [](const std::string& h, int p) {
         return "node fetch.js http://" + h + ":" + std::to_string(p) + "/node 2>&1; rc=$?; echo \"rc=$rc\"";
       },
       ServeHttp, {"node-error EAI_AGAIN", "node-error ENOTFOUND"}, {"node-error ECONNREFUSED"}},
      {"python", {}, "api.test", 8080,
       [](const Sandbox& sb) {
         WriteFile(sb.ws() + "/pyclient.py", kPythonClient);
         return std::string();
       },
       [](const std::string& h, int p) {
         return "python3 pyclient.py " + h + " " + std::to_string(p) + " 2>&1; rc=$?; echo \"rc=$rc\"";
       },
       ServeHttp, {"python-error gaierror"}, {"python-error errno 111"}},
      {"c", {"cc"}, "api.test", 8080,
       [](const Sandbox& sb) { return CompileC(sb, "netclient", kNetClient); },
       [](const std::string& h, int p) {
         return "./netclient " + h + " " + std::to_string(p) + " 2>&1; rc=$?; echo \"rc=$rc\"";
       },
       ServeHttp, {"getaddrinfo: "}, {"connect: Connection refused"}},
      {"git", {"git"}, "git.test", 9418, NoFiles,
       [](const std::string& h, int p) {
         const std::string port = p == 9418 ? "" : ":" + std::to_string(p);
         return "git ls-remote git://" + h + port + "/repo 2>&1; rc=$?; echo \"rc=$rc\"";
       },
       [](const Sandbox& sb, TestNetns& net, std::vector<std::string>* expect) {
         const std::string repo = sb.scratch() + "/git-root/repo";
         MakeDirs(repo);
         WriteFile(repo + "/README", "served by git daemon\n");
         const std::vector<std::vector<std::string>> steps = {
             {"init", "-q"},
             {"add", "README"},
             {"-c", "user.name=t", "-c", "user.email=t@t.test", "commit", "-q", "-m", "one"}};
         for (const auto& args : steps) {
           RunResult g = sb.Git(args, repo);
           ASSERT_EQ(g.status, 0) << g.Describe();
         }
         RunResult h = sb.Git({"rev-parse", "HEAD"}, repo);
         ASSERT_EQ(h.status, 0) << h.Describe();
         const std::string hash = h.out.substr(0, h.out.find('\n'));
         net.AddServer("gitd",
                       {FindTool("git"), "daemon", "--listen=198.18.0.10", "--port=9418", "--export-all",
                        "--reuseaddr", "--verbose", "--base-path=" + sb.scratch() + "/git-root"},
                       {"tcp:198.18.0.10:9418"});
         *expect = {hash + "\trefs/heads/main", "rc=0"};
       },
       {"unable to look up"}, {"Connection refused"}},
      {"ssh", {"ssh", "ssh-keygen"}, "ssh.test", 2222,
       [](const Sandbox& sb) {
         RunResult k = sb.Host({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", sb.ws() + "/id_test"});
         return k.status == 0 ? std::string() : "ssh-keygen: " + k.out + k.err;
       },
       SshCommand,
       [](const Sandbox& sb, TestNetns& net, std::vector<std::string>* expect) {
         const std::string dir = sb.scratch() + "/sshd";
         MakeDirs(dir, 0700);
         RunResult k = sb.Host({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", dir + "/host_key"});
         ASSERT_EQ(k.status, 0) << k.Describe();
         auto pub = ReadFile(sb.ws() + "/id_test.pub");
         ASSERT_TRUE(pub);
         WriteFile(dir + "/authorized_keys", *pub, 0600);
         WriteFile(dir + "/sshd_config",
                   "ListenAddress 198.18.0.10\n"
                   "HostKey " + dir + "/host_key\n"
                   "AuthorizedKeysFile " + dir + "/authorized_keys\n"
                   "PidFile none\nUsePAM no\nStrictModes no\nPasswordAuthentication no\n"
                   "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\nPermitRootLogin prohibit-password\n"
                   "PrintMotd no\nPrintLastLog no\nLogLevel VERBOSE\n"
                   "AllowUsers " + UserName() + "\n");
         // As root, sshd wants its privilege separation directory.
         if (getuid() == 0) net.NeedRunDir("sshd");
         net.AddServer("sshd", {"/usr/sbin/sshd", "-D", "-e", "-f", dir + "/sshd_config", "-p", "2222"},
                       {"tcp:198.18.0.10:2222"});
         *expect = {"ssh-ok", "rc=0"};
       },
       {"Could not resolve hostname"}, {"Connection refused"}},
  };
  return clients;
}

const Client& ClientNamed(const std::string& name) {
  for (const auto& c : Clients()) {
    if (c.name == name) return c;
  }
  throw std::runtime_error("no client " + name);
}

bool HasAny(const std::string& out, const std::vector<std::string>& alternatives) {
  return std::any_of(alternatives.begin(), alternatives.end(), [&](const std::string& a) { return Contains(out, a); });
}

class TransparentClient : public ::testing::TestWithParam<std::string> {
 protected:
  // Why the client cannot run here ("" when it can: then its files are
  // written, and a failure to write them is the test's failure). With
  // `server`, the servers it talks to must be installed too.
  std::string Prepare(const Client& c, bool server) {
    if (std::string why = TestNetns::WhyNot(); !why.empty()) return why;
    if (c.name == "c" && FindTool("cc").empty()) return "no C compiler";
    if (server && c.name == "ssh" && FindTool("sshd") != "/usr/sbin/sshd") return "/usr/sbin/sshd is not installed";
    if (std::string why = Missing(c.tools); !why.empty()) return why;
    const std::string failed = c.prepare(sb_);
    EXPECT_EQ(failed, "") << "preparing the " << c.name << " client";
    return "";
  }
  Sandbox sb_;
};

// Allowed by name (with the IP entry for its address): the client gets
// through with no proxy at all; the broker's log line names the host.
TEST_P(TransparentClient, AllowedNameWithoutProxyVariables) {
  const Client& c = ClientNamed(GetParam());
  if (std::string why = Prepare(c, true); !why.empty()) GTEST_SKIP() << "not applicable here: " << why;
  if (HasFailure()) return;
  TestNetns net(sb_, kHosts);
  std::vector<std::string> expect;
  c.serve(sb_, net, &expect);
  if (HasFatalFailure()) return;
  const std::string log = sb_.scratch() + "/net.jsonl";
  RunResult r = net.Sh(kNoProxy + "env | grep -ci _proxy=; " + c.command(c.host, c.port) + "; exit $rc",
                       {"--policy", WritePolicy(sb_, kAllow), "--network-log", log}, kRunMs);
  ASSERT_EQ(NetnsError(r), "") << r.Describe();
  for (const auto& e : expect) EXPECT_TRUE(Contains(r.out, e)) << e << "\n" << r.Describe();
  ASSERT_FALSE(Lines(r.out).empty()) << r.Describe();
  EXPECT_EQ(Lines(r.out)[0], "0") << "proxy variables were left in the environment\n" << r.Describe();
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << r.Describe();
  EXPECT_GE(Allowed(r), 1) << r.Describe();
  EXPECT_TRUE(NetDenials(r).empty()) << r.Describe();
  bool brokered = false;
  for (const auto& line : JsonLines(log)) {
    if (line["protocol"] == "connect" && line["host"] == c.host && line["port"] == c.port &&
        line["decision"] == "allow" && line["address"] == kAddr) {
      brokered = true;
    }
  }
  EXPECT_TRUE(brokered) << ReadFile(log).value_or("(no network log)") << "\n" << r.Describe();
}

// A name outside network.allow: the DNS refuses it, though its address and
// port are admitted by an IP entry; nothing reaches the server.
TEST_P(TransparentClient, NameNotAllowedIsRefusedByTheDns) {
  const Client& c = ClientNamed(GetParam());
  if (std::string why = Prepare(c, false); !why.empty()) GTEST_SKIP() << "not applicable here: " << why;
  if (HasFailure()) return;
  TestNetns net(sb_, kHosts);
  net.AddPythonServer("web", {"tcp:198.18.0.10:8080"});
  RunResult r = net.Sh(kNoProxy + c.command("other.test", 8080) + "; exit $rc", {"--policy", WritePolicy(sb_, kAllow)},
                       kRunMs);
  ASSERT_EQ(NetnsError(r), "") << r.Describe();
  EXPECT_TRUE(HasAny(r.out, c.unresolved)) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "rc=0")) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
  const nlohmann::json* d = NetDenial(r, "dns", "other.test");
  ASSERT_NE(d, nullptr) << r.Describe();
  EXPECT_TRUE(Contains((*d)["reason"].get<std::string>(), "dns: other.test not allowed by network.allow"))
      << r.Describe();
  EXPECT_EQ(CountLines(net.Log("web"), "ACCEPT"), 0) << net.Log("web");
}

// An allowed name on a port outside network.allow: it resolves, and the
// connect() is refused by the broker; nothing reaches the server there.
TEST_P(TransparentClient, AllowedNameOnAPortNotAllowedIsRefusedAtConnect) {
  const Client& c = ClientNamed(GetParam());
  if (std::string why = Prepare(c, false); !why.empty()) GTEST_SKIP() << "not applicable here: " << why;
  if (HasFailure()) return;
  TestNetns net(sb_, kHosts);
  net.AddPythonServer("web", {"tcp:198.18.0.10:9090"});
  RunResult r = net.Sh(kNoProxy + c.command("api.test", 9090) + "; exit $rc", {"--policy", WritePolicy(sb_, kAllow)},
                       kRunMs);
  ASSERT_EQ(NetnsError(r), "") << r.Describe();
  EXPECT_TRUE(HasAny(r.out, c.refused)) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "rc=0")) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
  const nlohmann::json* d = NetDenial(r, "connect", "api.test:9090");
  ASSERT_NE(d, nullptr) << r.Describe();
  EXPECT_EQ((*d)["source"], "broker") << r.Describe();
  EXPECT_EQ(NetDenial(r, "dns", "api.test"), nullptr) << r.Describe();
  EXPECT_EQ(CountLines(net.Log("web"), "ACCEPT"), 0) << net.Log("web");
}

INSTANTIATE_TEST_SUITE_P(Clients, TransparentClient, ::testing::Values("curl", "node", "python", "c", "git", "ssh"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// ------------------------------------------------------------------ policy

// A name allowed without an IP entry for its non-public address: the
// address guard holds, whichever step refuses it, and nothing arrives.
TEST(TransparentEgress, NameToANonPublicAddressNeedsAnIpEntry) {
  if (std::string why = Missing({"curl"}); !why.empty()) GTEST_SKIP() << "not applicable here: " << why;
  Sandbox sb;
  TestNetns net(sb, kHosts);
  net.AddPythonServer("web", {"tcp:198.18.0.10:8080"});
  RunResult r = net.Sh(kNoProxy + "curl -sS -m 20 http://api.test:8080/ 2>&1; rc=$?; echo \"rc=$rc\"; exit $rc",
                       {"--policy", WritePolicy(sb, {"api.test:8080"})}, kRunMs);
  ASSERT_EQ(NetnsError(r), "") << r.Describe();
  EXPECT_FALSE(Contains(r.out, kHello)) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "rc=0")) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
  bool named = false;
  for (const auto& d : NetDenials(r)) named = named || Contains(d["target"].get<std::string>(), "api.test");
  EXPECT_TRUE(named) << r.Describe();
  EXPECT_EQ(CountLines(net.Log("web"), "ACCEPT"), 0) << net.Log("web");
}

// No network section at all: the DNS answers, with a refusal that says
// why, at once; the literal address is refused too.
TEST(TransparentEgress, NetworkingOffByPolicyFailsFastAndSaysWhy) {
  if (std::string why = Missing({"curl"}); !why.empty()) GTEST_SKIP() << "not applicable here: " << why;
  Sandbox sb;
  TestNetns net(sb, kHosts);
  net.AddPythonServer("web", {"tcp:198.18.0.10:8080"});
  RunResult r = net.Sh(kNoProxy +
                           "curl -sS http://api.test:8080/ 2>&1; echo \"rc=$?\"\n"
                           "python3 -c 'import socket\ntry:\n    socket.create_connection((\"198.18.0.10\", 8080), "
                           "timeout=5); print(\"literal ok\")\nexcept OSError as e: print(\"literal errno\", e.errno)'",
                       {"--policy", WritePolicy(sb, {})}, 10000);
  ASSERT_EQ(NetnsError(r), "") << r.Describe();
  EXPECT_FALSE(r.timed_out) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "rc=6")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "Could not resolve host")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "literal errno")) << r.Describe();
  const nlohmann::json* d = NetDenial(r, "dns", "api.test");
  ASSERT_NE(d, nullptr) << r.Describe();
  EXPECT_TRUE(Contains((*d)["reason"].get<std::string>(), "networking is off")) << r.Describe();
  EXPECT_EQ(CountLines(net.Log("web"), "ACCEPT"), 0) << net.Log("web");
}

// ------------------------------------------------------------------ hostile

// An IP literal that no entry admits (a server listens there): refused at
// connect, reported by address, and the server never sees it; the allowed
// server beside it does.
TEST(TransparentEgress, LiteralAddressNotAllowedNeverConnects) {
  if (std::string why = Missing({"curl"}); !why.empty()) GTEST_SKIP() << "not applicable here: " << why;
  Sandbox sb;
  TestNetns net(sb, kHosts);
  net.AddPythonServer("web", {"tcp:198.18.0.10:8080", "tcp:198.18.0.11:8080"});
  RunResult r = net.Sh(kNoProxy +
                           "python3 -c 'import socket\ntry:\n    socket.create_connection((\"198.18.0.11\", 8080), "
                           "timeout=10); print(\"literal ok\")\nexcept OSError as e: print(\"literal errno\", e.errno)'\n"
                           "curl -sS -m 20 http://198.18.0.11:8080/ 2>&1; echo \"curl-literal rc=$?\"\n"
                           "curl -sS -m 20 http://api.test:8080/control 2>&1; echo \"curl-allowed rc=$?\"\n",
                       {"--policy", WritePolicy(sb, kAllow)}, kRunMs);
  ASSERT_EQ(NetnsError(r), "") << r.Describe();
  EXPECT_TRUE(Contains(r.out, "literal errno 111")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "curl-literal rc=7")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, kHello)) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "curl-allowed rc=0")) << r.Describe();
  const nlohmann::json* d = NetDenial(r, "connect", "198.18.0.11:8080");
  ASSERT_NE(d, nullptr) << r.Describe();
  EXPECT_EQ((*d)["source"], "broker") << r.Describe();
  EXPECT_EQ((*d)["count"], 2) << r.Describe();
  const std::string log = net.Log("web");
  EXPECT_EQ(CountLines(log, "ACCEPT 198.18.0.11:8080"), 0) << log;
  EXPECT_EQ(CountLines(log, "SERVED 198.18.0.10:8080 GET /control"), 1) << log;
}

// One thread connect()s in a loop to an allowed address while another
// flips the sockaddr it passes between that address and a refused one:
// whatever the broker checked is what it dialled, so the refused server
// never accepts, and every connected socket's peer is the allowed address.
const char* const kRacer = R"C(
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
static struct sockaddr_in target;
static volatile int stop;
static unsigned long flips;
static in_addr_t allowed, refused;
static void* flip(void* unused) {
  (void)unused;
  volatile in_addr_t* a = (volatile in_addr_t*)&target.sin_addr.s_addr;
  volatile unsigned char* last = (volatile unsigned char*)a + 3;
  while (!stop) {
    *a = refused;
    *a = allowed;
    *last = ((unsigned char*)&refused)[3];  /* one byte at a time too */
    *last = ((unsigned char*)&allowed)[3];
    ++flips;
  }
  return NULL;
}
static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}
int main(int argc, char** argv) {
  if (argc != 5) return 64;
  allowed = inet_addr(argv[1]);
  refused = inet_addr(argv[2]);
  target.sin_family = AF_INET;
  target.sin_port = htons(atoi(argv[3]));
  target.sin_addr.s_addr = allowed;
  pthread_t t;
  if (pthread_create(&t, NULL, flip, NULL) != 0) return 65;
  long connects = 0, ok = 0, denied = 0, other = 0, wrong_peer = 0;
  int last_errno = 0;
  const double end = now() + atof(argv[4]);
  while (now() < end) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) { other++; last_errno = errno; continue; }
    ++connects;
    if (connect(s, (struct sockaddr*)&target, sizeof target) == 0) {
      ++ok;
      struct sockaddr_in peer;
      socklen_t len = sizeof peer;
      if (getpeername(s, (struct sockaddr*)&peer, &len) != 0 || peer.sin_addr.s_addr != allowed) ++wrong_peer;
    } else if (errno == ECONNREFUSED) {
      ++denied;
    } else {
      ++other;
      last_errno = errno;
    }
    close(s);
  }
  stop = 1;
  pthread_join(t, NULL);
  printf("connects=%ld ok=%ld refused=%ld other=%ld wrong_peer=%ld flipped=%d last_errno=%d\n", connects, ok, denied,
         other, wrong_peer, flips > 0, last_errno);
  return 0;
}
)C";

TEST(TransparentEgress, SockaddrFlippedDuringTheNotificationNeverReachesTheRefusedAddress) {
  if (std::string why = Missing({}); !why.empty()) GTEST_SKIP() << "not applicable here: " << why;
  if (FindTool("cc").empty()) GTEST_SKIP() << "not applicable here: no C compiler";
  Sandbox sb;
  ASSERT_EQ(CompileC(sb, "racer", kRacer), "");
  TestNetns net(sb, kHosts);
  net.AddPythonServer("web", {"tcp:198.18.0.10:8080", "tcp:198.18.0.11:8080"});
  RunResult r = net.Sh(kNoProxy + "./racer 198.18.0.10 198.18.0.11 8080 2", {"--policy", WritePolicy(sb, kAllow)},
                       kRunMs);
  ASSERT_EQ(NetnsError(r), "") << r.Describe();
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "wrong_peer=0 ")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "other=0 ")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "flipped=1")) << r.Describe();
  // Both sides of the flip were seen: some connects got through, some were refused.
  EXPECT_FALSE(Contains(r.out, " ok=0 ")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, " refused=0 ")) << r.Describe();
  const std::string log = net.Log("web");
  EXPECT_EQ(CountLines(log, "ACCEPT 198.18.0.11:8080"), 0) << r.out;
  EXPECT_GT(CountLines(log, "ACCEPT 198.18.0.10:8080"), 0) << r.out;
  EXPECT_NE(NetDenial(r, "connect", "198.18.0.11:8080"), nullptr) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << r.Describe();
}

// Malformed queries over UDP and TCP, then a flood for an allowed name:
// the DNS still answers, the broker still connects, the run ends normally.
const char* const kDnsAbuse = R"PY(
import os, random, socket, struct, sys
random.seed(1)
def header(qid, flags=0x0100, qd=1, an=0, ns=0, ar=0):
    return struct.pack(">HHHHHH", qid, flags, qd, an, ns, ar)
def qname(name):
    return b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0"
def query(name, qid, qtype=1):
    return header(qid) + qname(name) + struct.pack(">HH", qtype, 1)
def answer_of(data):
    rcode, ancount = data[3] & 15, struct.unpack(">H", data[6:8])[0]
    addrs = []
    if rcode == 0 and ancount:
        addrs.append(socket.inet_ntoa(data[-4:]))
    return rcode, addrs
malformed = [b"", b"\0", b"\0" * 11, header(1, qd=0), header(2) + b"\xc0\x0c\0\1\0\1",
             header(3) + b"\xc0\x0e\xc0\x0c\0\1\0\1", header(4) + b"\x3f" + b"a" * 63 + b"\x3f" + b"b" * 63 +
             b"\x3f" + b"c" * 63 + b"\x3f" + b"d" * 63 + b"\0\0\1\0\1", header(5) + b"\x20abc",
             header(6, qd=2) + qname("api.test") + b"\0\1\0\1" + qname("evil.test") + b"\0\1\0\1",
             header(7, qd=65535) + qname("api.test") + b"\0\1\0\1", header(8, flags=0x8180) + qname("api.test") + b"\0\1\0\1",
             header(9, flags=0x2900) + qname("api.test") + b"\0\1\0\1",
             header(10, ar=1) + qname("api.test") + b"\0\1\0\1" + b"\0\0\x29\xff\xff\0\0\0\0\xff\xff",
             query("api.test", 11) + b"trailing", os.urandom(65507)]
malformed += [os.urandom(random.randrange(1, 600)) for _ in range(300)]
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.connect(("127.0.0.1", 53))
u.settimeout(0.05)
for m in malformed:
    u.send(m)
    try:
        u.recv(65535)
    except socket.timeout:
        pass
print("udp malformed sent", len(malformed), flush=True)
for payload in (b"\0\0", b"\xff\xff" + os.urandom(65535), b"\xff\xff" + b"\0" * 100, b"\0\x0c" + header(12, qd=0),
                struct.pack(">H", 18) + header(13) + b"\xc0\x0c\0\1\0\1", os.urandom(3000)):
    t = socket.create_connection(("127.0.0.1", 53), timeout=5)
    try:
        t.sendall(payload)
        t.settimeout(0.5)
        t.recv(65535)
    except OSError:
        pass
    t.close()
print("tcp malformed sent", flush=True)
f = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
f.connect(("127.0.0.1", 53))
f.settimeout(2)
answered = 0
for start in range(0, 5000, 100):
    want = set()
    for i in range(start, start + 100):
        f.send(query("api.test", i))
        want.add(i)
    try:
        while want:
            data = f.recv(4096)
            qid = struct.unpack(">H", data[:2])[0]
            if qid in want and answer_of(data) == (0, ["198.18.0.10"]):
                want.discard(qid)
                answered += 1
    except socket.timeout:
        pass
print("flood answered", answered, flush=True)
a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
a.settimeout(5)
a.sendto(query("api.test", 4242), ("127.0.0.1", 53))
data = a.recv(4096)
print("after udp", struct.unpack(">H", data[:2])[0], answer_of(data), flush=True)
t = socket.create_connection(("127.0.0.1", 53), timeout=5)
q = query("api.test", 4343, 1)
t.sendall(struct.pack(">H", len(q)) + q)
n = struct.unpack(">H", t.recv(2))[0]
data = b""
while len(data) < n:
    data += t.recv(n - len(data))
print("after tcp", struct.unpack(">H", data[:2])[0], answer_of(data), flush=True)
print("after getaddrinfo", sorted({a[4][0] for a in socket.getaddrinfo("api.test", 8080, socket.AF_INET)}), flush=True)
)PY";

TEST(TransparentEgress, DnsAbuseFromInsideLeavesTheDnsAnswering) {
  if (std::string why = Missing({"curl"}); !why.empty()) GTEST_SKIP() << "not applicable here: " << why;
  Sandbox sb;
  WriteFile(sb.ws() + "/dns_abuse.py", kDnsAbuse);
  TestNetns net(sb, kHosts);
  net.AddPythonServer("web", {"tcp:198.18.0.10:8080"});
  RunResult r = net.Sh(kNoProxy + "python3 dns_abuse.py 2>&1; echo \"abuse rc=$?\"\n"
                                  "curl -sS -m 20 http://api.test:8080/after 2>&1; echo \"curl rc=$?\"",
                       {"--policy", WritePolicy(sb, kAllow)}, kRunMs);
  ASSERT_EQ(NetnsError(r), "") << r.Describe();
  EXPECT_TRUE(Contains(r.out, "udp malformed sent")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "tcp malformed sent")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "after udp 4242 (0, ['198.18.0.10'])")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "after tcp 4343 (0, ['198.18.0.10'])")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "after getaddrinfo ['198.18.0.10']")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "abuse rc=0")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, kHello)) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "curl rc=0")) << r.Describe();
  // Over loopback with 100 queries in flight, every query is answered.
  int answered = -1;
  for (const auto& line : Lines(r.out)) {
    if (line.rfind("flood answered ", 0) == 0) answered = std::atoi(line.c_str() + 15);
  }
  EXPECT_EQ(answered, 5000) << r.Describe();
  EXPECT_FALSE(r.timed_out) << r.Describe();
  ASSERT_TRUE(r.report) << r.Describe();
  // Whatever names the random bytes made up were refused: bounded denials, nothing else.
  EXPECT_EQ(OutcomeOf(r), "exited") << r.Describe();
  EXPECT_EQ(ReportInt(r, "exit_code"), 0) << r.Describe();
  EXPECT_LE(NetDenials(r).size(), 32u) << r.Describe();
  for (const auto& d : NetDenials(r)) EXPECT_EQ(d["op"], "dns") << r.Describe();
  EXPECT_EQ(CountLines(net.Log("web"), "SERVED 198.18.0.10:8080 GET /after"), 1) << net.Log("web");
}

// UDP reaches only the DNS: a datagram to any other port (a server
// listens there) fails with ENETUNREACH and never arrives.
TEST(TransparentEgress, UdpReachesOnlyTheDns) {
  if (std::string why = Missing({}); !why.empty()) GTEST_SKIP() << "not applicable here: " << why;
  Sandbox sb;
  TestNetns net(sb, kHosts);
  net.AddPythonServer("udp", {"udp:198.18.0.10:9999"});
  const std::string script =
      "import socket, struct\n"
      "def attempt(name, call):\n"
      "    try:\n"
      "        call(); print(name, 'ok')\n"
      "    except OSError as e: print(name, 'errno', e.errno)\n"
      "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
      "attempt('sendto', lambda: s.sendto(b'literal', ('198.18.0.10', 9999)))\n"
      "attempt('sendto-name', lambda: s.sendto(b'by-name', ('api.test', 9999)))\n"
      "c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
      "attempt('connect', lambda: (c.connect(('198.18.0.10', 9999)), c.send(b'connected')))\n"
      "d = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
      "d.settimeout(5)\n"
      "q = struct.pack('>HHHHHH', 77, 0x0100, 1, 0, 0, 0) + b'\\x03api\\x04test\\x00\\x00\\x01\\x00\\x01'\n"
      "d.sendto(q, ('127.0.0.1', 53))\n"
      "a = d.recv(512)\n"
      "print('dns', struct.unpack('>H', a[:2])[0], a[3] & 15, socket.inet_ntoa(a[-4:]))\n";
  WriteFile(sb.ws() + "/udp.py", script);
  RunResult r = net.Sh(kNoProxy + "python3 udp.py", {"--policy", WritePolicy(sb, kAllow)}, kRunMs);
  ASSERT_EQ(NetnsError(r), "") << r.Describe();
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(Lines(r.out), (std::vector<std::string>{"sendto errno 101", "sendto-name errno 101", "connect errno 101",
                                                    "dns 77 0 198.18.0.10"}))
      << r.Describe();
  EXPECT_EQ(CountLines(net.Log("udp"), "UDP"), 0) << net.Log("udp");
}

// A socket dup()ed before its connect(): the broker puts the connected
// socket in place of the descriptor that called connect(), and the
// duplicate still holds the caller's own socket, unconnected, and subject to
// the same rules when it connects.
// A socket the broker installed is the host's. Connected, it stays where it
// was allowed to go (another address: EISCONN, as the kernel says); left
// free by a failed handshake, it can neither listen (a host port on every
// interface) nor be connected elsewhere without a new decision.
TEST(TransparentEgress, AnInstalledSocketGoesNowhereElse) {
  if (std::string why = Missing({}); !why.empty()) GTEST_SKIP() << "not applicable here: " << why;
  Sandbox sb;
  TestNetns net(sb, kHosts);
  net.AddPythonServer("web", {"tcp:198.18.0.10:8080", "tcp:198.18.0.11:8080"});
  net.AddPythonServer("host-loopback", {"tcp:127.0.0.1:8080"});
  const std::string script =
      "import errno, select, socket\n"
      "s = socket.create_connection(('api.test', 8080))\n"
      "try:\n"
      "    s.connect(('198.18.0.11', 8080)); print('again ok')\n"
      "except OSError as e: print('again errno', e.errno)\n"
      // Nothing listens on 198.18.0.10:8081 (allowed): the handshake fails
      // after the socket was installed (non-blocking: EINPROGRESS first).
      "f = socket.socket(); f.setblocking(False)\n"
      "print('connect', f.connect_ex(('198.18.0.10', 8081)))\n"
      "select.select([], [f], [], 5)\n"
      "print('so_error', f.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))\n"
      "try:\n"
      "    f.bind(('0.0.0.0', 0)); f.listen(1); print('listen ok', f.getsockname())\n"
      "except OSError as e: print('listen errno', e.errno)\n"
      "f.setblocking(True)\n"
      "try:\n"
      "    f.connect(('198.18.0.11', 8080)); print('reuse ok')\n"
      "except OSError as e: print('reuse errno', e.errno)\n"
      // The host's socket, still free: the loopback it would reach is the host's.
      "try:\n"
      "    f.connect(('127.0.0.1', 8080)); print('loopback ok')\n"
      "except OSError as e: print('loopback errno', e.errno)\n";
  WriteFile(sb.ws() + "/again.py", script);
  RunResult r = net.Sh(kNoProxy + "python3 again.py",
                       {"--policy", WritePolicy(sb, {"api.test", "198.18.0.10"})}, kRunMs);
  ASSERT_EQ(NetnsError(r), "") << r.Describe();
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(Lines(r.out), (std::vector<std::string>{"again errno 106", "connect 115", "so_error 111",
                                                    "listen errno 13", "reuse errno 111", "loopback errno 13"}))
      << r.Describe();
  const std::string log = net.Log("web");
  EXPECT_EQ(CountLines(log, "ACCEPT 198.18.0.11:8080"), 0) << log;
  EXPECT_EQ(CountLines(net.Log("host-loopback"), "ACCEPT"), 0) << net.Log("host-loopback");
  EXPECT_NE(NetDenial(r, "listen", "AF_INET"), nullptr) << r.Describe();
  EXPECT_NE(NetDenial(r, "connect", "198.18.0.11:8080"), nullptr) << r.Describe();
}

// on_unknown_domain: ask puts the question when the name is looked up:
// --ask-command is asked about the name (port 0: any port); a yes makes it
// resolvable and its connections allowed, a no is a refusal the report
// names.
TEST(TransparentEgress, AskedWhenTheNameIsLookedUp) {
  if (std::string why = Missing({"curl"}); !why.empty()) GTEST_SKIP() << "not applicable here: " << why;
  Sandbox sb;
  TestNetns net(sb, kHosts);
  net.AddPythonServer("web", {"tcp:198.18.0.10:8080", "tcp:198.18.0.11:8080"});
  const std::string policy = sb.scratch() + "/ask.yaml";
  // The IP entries only pass the address guard (198.18/15 is not public):
  // the names are what is asked about.
  WriteFile(policy, "version: 1\nmode: workspace-write\nnetwork:\n  allow: [\"198.18.0.10:8080\", "
                    "\"198.18.0.11:8080\"]\n  on_unknown_domain: ask\n");
  const std::string asked = sb.scratch() + "/asked.jsonl";
  const std::string ask = sb.scratch() + "/ask.sh";
  WriteFile(ask, "#!/bin/sh\nq=$(cat)\necho \"$q\" >> '" + asked + "'\ncase \"$q\" in *'\"api.test\"'*) echo allow;; "
                 "*) echo deny;; esac\n", 0755);
  RunResult r = net.Sh(kNoProxy + "curl -sS -m 10 http://api.test:8080/ask; echo api=$?; "
                       "curl -sS -m 10 http://other.test:8080/ask; echo other=$?",
                       {"--policy", policy, "--ask-command", ask}, kRunMs);
  ASSERT_EQ(NetnsError(r), "") << r.Describe();
  EXPECT_TRUE(Contains(r.out, "api=0")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "other=6")) << r.Describe();
  const std::string questions = ReadFile(asked).value_or("");
  EXPECT_EQ(CountLines(questions, "{\"host\":\"api.test\",\"port\":0}"), 1) << questions;
  EXPECT_EQ(CountLines(questions, "{\"host\":\"other.test\",\"port\":0}"), 1) << questions;
  const nlohmann::json* d = NetDenial(r, "dns", "other.test");
  ASSERT_NE(d, nullptr) << r.Describe();
  EXPECT_NE((*d)["reason"].get<std::string>().find("the answer to the question"), std::string::npos) << r.Describe();
  const std::string log = net.Log("web");
  EXPECT_EQ(CountLines(log, "SERVED 198.18.0.10:8080 GET /ask"), 1) << log;
  EXPECT_EQ(CountLines(log, "ACCEPT 198.18.0.11:8080"), 0) << log;
}

// A host that holds a secret is reached through the terminator even when the
// sandbox connects directly: the broker's socket leads to the proxy, which
// ends TLS with the per-run CA, adds the credential and masks it in the
// answer. The value is never inside.
const char* const kEchoAuthServer = R"PY(
import http.server, ssl, sys
cert, key, host, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("auth=%s\n" % self.headers.get("Authorization")).encode()
        print("SERVED %s %s" % (self.path, self.headers.get("Authorization")), flush=True)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
httpd = http.server.HTTPServer((host, port), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
httpd.serve_forever()
)PY";

TEST(TransparentEgress, ASecretsHostGoesThroughTheTerminatorWithoutProxyVariables) {
  if (std::string why = Missing({"curl", "openssl"}); !why.empty()) GTEST_SKIP() << "not applicable here: " << why;
  Sandbox sb;
  TestCa ca(sb.scratch());
  ASSERT_TRUE(ca.ok) << ca.log;
  TestNetns net(sb, kHosts);
  const std::string server = sb.scratch() + "/echo_auth.py";
  WriteFile(server, kEchoAuthServer);
  net.AddServer("tls", {Python(), server, ca.server_pem, ca.server_key, kAddr, "8443"}, {"tcp:198.18.0.10:8443"});
  const std::string policy = sb.scratch() + "/secret.yaml";
  WriteFile(policy, "version: 1\nmode: workspace-write\nnetwork:\n  allow: [\"api.test\", \"198.18.0.10:8443\"]\n"
                    "credentials:\n  secrets:\n    tok: { from: { env: TE_TOKEN }, hosts: [api.test], "
                    "inject: { header: Authorization, format: \"Bearer {}\" } }\n");
  const std::string token = "te-" + RandomHex();
  RunResult r = net.Sh(kNoProxy + "curl -sS -m 10 https://api.test:8443/secret; echo rc=$?; env | grep -c " + token +
                           "; true",
                       {"--policy", policy}, kRunMs, {"TE_TOKEN=" + token, "SSL_CERT_FILE=" + ca.ca_pem});
  ASSERT_EQ(NetnsError(r), "") << r.Describe();
  EXPECT_TRUE(Contains(r.out, "auth=Bearer ******")) << r.Describe();  // added, and masked on the way back
  EXPECT_TRUE(Contains(r.out, "rc=0")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, token)) << r.Describe();
  EXPECT_EQ(CountLines(net.Log("tls"), "SERVED /secret Bearer " + token), 1) << net.Log("tls");
  ASSERT_TRUE(r.report);
  const auto& uses = (*r.report)["credentials"]["uses"];
  ASSERT_TRUE(uses.is_array() && uses.size() == 1) << r.Describe();
  EXPECT_EQ(uses[0]["secret"], "tok") << r.Describe();
  EXPECT_EQ(uses[0]["host"], "api.test") << r.Describe();
}

// A direct connection carries no SNI check: a handshake naming another
// tenant of an allowed address goes through (domain fronting), which the
// docs and explain say; network.inspect_tls keeps the relay and the check.
TEST(TransparentEgress, InspectTlsKeepsTheSniCheckForBrokeredConnections) {
  if (std::string why = Missing({"curl", "openssl"}); !why.empty()) GTEST_SKIP() << "not applicable here: " << why;
  for (const bool inspect : {false, true}) {
    SCOPED_TRACE(inspect ? "inspect_tls: true" : "inspect_tls: false");
    Sandbox sb;
    TestCa ca(sb.scratch());
    ASSERT_TRUE(ca.ok) << ca.log;
    TestNetns net(sb, kHosts);
    const std::string server = sb.scratch() + "/echo_auth.py";
    WriteFile(server, kEchoAuthServer);
    net.AddServer("tls", {Python(), server, ca.server_pem, ca.server_key, kAddr, "8443"}, {"tcp:198.18.0.10:8443"});
    const std::string policy = sb.scratch() + "/inspect.yaml";
    WriteFile(policy, std::string("version: 1\nmode: workspace-write\nnetwork:\n  allow: [\"api.test\", "
                                  "\"198.18.0.10:8443\"]\n  tls_sni_ports: [8443]\n  inspect_tls: ") +
                          (inspect ? "true" : "false") + "\n");
    RunResult r = net.Sh(kNoProxy + "curl -skS -m 10 https://api.test:8443/own; echo own=$?; "
                         "curl -skS -m 10 --resolve front.test:8443:198.18.0.10 https://front.test:8443/fronted; "
                         "echo fronted=$?",
                         {"--policy", policy}, kRunMs);
    ASSERT_EQ(NetnsError(r), "") << r.Describe();
    EXPECT_TRUE(Contains(r.out, "own=0")) << r.Describe();
    const std::string log = net.Log("tls");
    EXPECT_EQ(CountLines(log, "SERVED /own"), 1) << log;
    if (!inspect) {
      EXPECT_TRUE(Contains(r.out, "fronted=0")) << r.Describe();
      EXPECT_EQ(CountLines(log, "SERVED /fronted"), 1) << log;
      continue;
    }
    EXPECT_FALSE(Contains(r.out, "fronted=0")) << r.Describe();
    EXPECT_EQ(CountLines(log, "SERVED /fronted"), 0) << log;
    const nlohmann::json* d = NetDenial(r, "connect", "api.test:8443");
    ASSERT_NE(d, nullptr) << r.Describe();
    EXPECT_NE((*d)["reason"].get<std::string>().find("sni-mismatch"), std::string::npos) << r.Describe();
    EXPECT_NE((*d)["reason"].get<std::string>().find("front.test"), std::string::npos) << r.Describe();
  }
}

// What dev servers and npm call: Node's os.networkInterfaces() reads the
// interfaces over NETLINK_ROUTE, on both backends, with no denial.
TEST(TransparentEgress, NodeListsTheInterfacesWithoutADenial) {
  if (std::string why = Missing({"node"}); !why.empty()) GTEST_SKIP() << "not applicable here: " << why;
  for (const std::vector<std::string>& backend :
       {std::vector<std::string>{}, std::vector<std::string>{"--backend", "landlock", "--require", "partial"}}) {
    Sandbox sb;
    RunResult r = sb.RunArgv({"node", "-e", "console.log('ifaces', Object.keys(require('os').networkInterfaces()).join(','))"},
                             backend);
    EXPECT_EQ(r.status, 0) << r.Describe();
    EXPECT_TRUE(Contains(r.out, "ifaces ") && Contains(r.out, "lo")) << r.Describe();
    ASSERT_TRUE(r.report) << r.Describe();
    for (const auto& d : (*r.report)["denials"]) EXPECT_NE(d["op"], "socket") << r.Describe();
    if (!backend.empty()) {
      // Landlock-only: the host's network, whose interfaces show.
      EXPECT_NE((*r.report)["enforcement"]["backend"], "linux-namespaces") << r.Describe();
    }
  }
}

TEST(TransparentEgress, DuplicateOfASocketStaysUnconnectedAndIsStillDecided) {
  if (std::string why = Missing({}); !why.empty()) GTEST_SKIP() << "not applicable here: " << why;
  Sandbox sb;
  TestNetns net(sb, kHosts);
  net.AddPythonServer("web", {"tcp:198.18.0.10:8080", "tcp:198.18.0.11:8080"});
  const std::string script =
      "import socket\n"
      "s = socket.socket()\n"
      "d = s.dup()\n"
      "s.connect(('api.test', 8080))\n"
      "s.sendall(b'GET /dup HTTP/1.0\\r\\nHost: api.test\\r\\n\\r\\n')\n"
      "print('s', s.makefile('rb').read().decode().splitlines()[-1])\n"
      "try:\n"
      "    print('d peer', d.getpeername())\n"
      "except OSError as e: print('d getpeername errno', e.errno)\n"
      "try:\n"
      "    d.connect(('198.18.0.11', 8080)); print('d connect ok')\n"
      "except OSError as e: print('d connect errno', e.errno)\n";
  WriteFile(sb.ws() + "/dup.py", script);
  RunResult r = net.Sh(kNoProxy + "python3 dup.py", {"--policy", WritePolicy(sb, kAllow)}, kRunMs);
  ASSERT_EQ(NetnsError(r), "") << r.Describe();
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(Lines(r.out), (std::vector<std::string>{"s " + kHello, "d getpeername errno 107", "d connect errno 111"}))
      << r.Describe();
  const std::string log = net.Log("web");
  EXPECT_EQ(CountLines(log, "ACCEPT 198.18.0.11:8080"), 0) << log;
  EXPECT_EQ(CountLines(log, "SERVED 198.18.0.10:8080 GET /dup"), 1) << log;
  EXPECT_NE(NetDenial(r, "connect", "198.18.0.11:8080"), nullptr) << r.Describe();
}

// What a program sets up around connect() holds: a non-blocking connect
// answers EINPROGRESS and completes; options set before connect() are set
// on the socket it gets; an IPv6 socket reaches a v4-mapped address.
TEST(TransparentEgress, NonBlockingConnectOptionsAndV4MappedAddresses) {
  if (std::string why = Missing({}); !why.empty()) GTEST_SKIP() << "not applicable here: " << why;
  Sandbox sb;
  TestNetns net(sb, kHosts);
  net.AddPythonServer("web", {"tcp:198.18.0.10:8080"});
  const std::string script =
      "import select, socket\n"
      "def fetch(s, path):\n"
      "    s.sendall(('GET %s HTTP/1.0\\r\\nHost: api.test\\r\\n\\r\\n' % path).encode())\n"
      "    data = b''\n"
      "    while True:\n"
      "        chunk = s.recv(4096)\n"
      "        if not chunk: return data.decode().splitlines()[-1]\n"
      "        data += chunk\n"
      "addr = socket.getaddrinfo('api.test', 8080, socket.AF_INET, socket.SOCK_STREAM)[0][4]\n"
      "s = socket.socket()\n"
      "s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)\n"
      "s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
      "s.setblocking(False)\n"
      "print('connect_ex', s.connect_ex(addr))\n"
      "_, writable, _ = select.select([], [s], [], 10)\n"
      "print('writable', writable == [s])\n"
      "print('so_error', s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))\n"
      "print('keepalive', s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0,\n"
      "      'nodelay', s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0)\n"
      "print('peer', s.getpeername())\n"
      "s.setblocking(True)\n"
      "print('nonblocking', fetch(s, '/nonblocking'))\n"
      "p = socket.socket()\n"
      "p.connect(addr)\n"
      "print('plain keepalive', p.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0)\n"
      "p.close()\n"
      "v6 = socket.socket(socket.AF_INET6)\n"
      "v6.connect(('::ffff:198.18.0.10', 8080))\n"
      "print('v6', fetch(v6, '/v6'))\n";
  WriteFile(sb.ws() + "/nb.py", script);
  const std::string log = sb.scratch() + "/net.jsonl";
  RunResult r = net.Sh(kNoProxy + "python3 nb.py 2>&1", {"--policy", WritePolicy(sb, kAllow), "--network-log", log},
                       kRunMs);
  ASSERT_EQ(NetnsError(r), "") << r.Describe();
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(Lines(r.out), (std::vector<std::string>{"connect_ex 115", "writable True", "so_error 0",
                                                    "keepalive True nodelay True", "peer ('198.18.0.10', 8080)",
                                                    "nonblocking " + kHello, "plain keepalive False", "v6 " + kHello}))
      << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << r.Describe();
  EXPECT_TRUE(NetDenials(r).empty()) << r.Describe();
  int brokered = 0;
  for (const auto& line : JsonLines(log)) {
    brokered += line["protocol"] == "connect" && line["decision"] == "allow" && line["port"] == 8080;
  }
  EXPECT_EQ(brokered, 3) << ReadFile(log).value_or("(no network log)");
  const std::string served = net.Log("web");
  EXPECT_EQ(CountLines(served, "SERVED 198.18.0.10:8080 GET /nonblocking"), 1) << served;
  EXPECT_EQ(CountLines(served, "SERVED 198.18.0.10:8080 GET /v6"), 1) << served;
}

// The sandbox's loopback is its own, whatever the policy admits: with a
// server on the supervisor's 127.0.0.1 and every loopback entry allowed,
// neither loopback nor "any" addresses (in either family) nor a name that
// resolves to 127.0.0.1 reach it. Nor does a TCP Fast Open sendto(), which
// connects without connect(), reach a refused address.
TEST(TransparentEgress, LoopbackAndOtherWaysAroundConnectStayInside) {
  if (std::string why = Missing({}); !why.empty()) GTEST_SKIP() << "not applicable here: " << why;
  Sandbox sb;
  TestNetns net(sb, kHosts + "127.0.0.1 loop.test\n");
  net.AddPythonServer("web", {"tcp:127.0.0.1:8080", "tcp:198.18.0.11:8080"});
  const std::string script =
      "import socket\n"
      "def attempt(name, family, addr):\n"
      "    s = socket.socket(family)\n"
      "    s.settimeout(5)\n"
      "    try:\n"
      "        s.connect(addr); print(name, 'connected', s.getpeername())\n"
      "    except socket.gaierror as e: print(name, 'gaierror')\n"
      "    except OSError as e: print(name, 'errno', e.errno)\n"
      "for name, family, host in (('v4', socket.AF_INET, '127.0.0.1'), ('v4-other', socket.AF_INET, '127.0.0.2'),\n"
      "                           ('v4-any', socket.AF_INET, '0.0.0.0'), ('localhost', socket.AF_INET, 'localhost'),\n"
      "                           ('name', socket.AF_INET, 'loop.test'), ('mapped', socket.AF_INET6, '::ffff:127.0.0.1'),\n"
      "                           ('mapped-any', socket.AF_INET6, '::ffff:0.0.0.0'), ('v6-any', socket.AF_INET6, '::')):\n"
      "    attempt(name, family, (host, 8080))\n"
      "for name, host in (('tfo-loopback', '127.0.0.1'), ('tfo-refused', '198.18.0.11')):\n"
      "    s = socket.socket()\n"
      "    try:\n"
      "        s.sendto(b'GET /tfo HTTP/1.0\\r\\n\\r\\n', socket.MSG_FASTOPEN, (host, 8080)); print(name, 'sent')\n"
      "    except OSError as e: print(name, 'errno', e.errno)\n";
  WriteFile(sb.ws() + "/loopback.py", script);
  RunResult r = net.Sh(kNoProxy + "python3 loopback.py",
                       {"--policy", WritePolicy(sb, {"127.0.0.0/8", "localhost:8080", "loop.test:8080", "::1"})},
                       kRunMs);
  ASSERT_EQ(NetnsError(r), "") << r.Describe();
  EXPECT_EQ(r.status, 0) << r.Describe();
  const auto lines = Lines(r.out);
  EXPECT_EQ(lines.size(), 10u) << r.Describe();
  for (const auto& line : lines) {
    EXPECT_TRUE(Contains(line, " errno ") || Contains(line, " gaierror")) << line << "\n" << r.Describe();
  }
  const std::string log = net.Log("web");
  EXPECT_EQ(CountLines(log, "ACCEPT"), 0) << log << "\n" << r.Describe();
}

// ------------------------------------------------------------------ landlock-only

// Two servers on the host's loopback, one port, two addresses: a server
// each on 127.0.0.2 and 127.0.0.3. Prints "PORT <n>", then "ACCEPT <addr>".
const char* const kTwoLoopbackServers = R"PY(
import socket, threading
a = socket.socket()
a.bind(("127.0.0.2", 0))
port = a.getsockname()[1]
b = socket.socket()
b.bind(("127.0.0.3", port))
def serve(srv, name):
    srv.listen(16)
    while True:
        c, _ = srv.accept()
        print("ACCEPT", name, flush=True)
        c.sendall(b"hello from " + name.encode() + b"\n")
        c.close()
ts = [threading.Thread(target=serve, args=(s, n), daemon=True) for s, n in ((a, "127.0.0.2"), (b, "127.0.0.3"))]
for t in ts:
    t.start()
print("PORT", port, flush=True)
for t in ts:
    t.join()
)PY";

// No network namespace: the sandbox's loopback is the host's. A direct
// connect to the allowed 127.0.0.2:PORT goes through; 127.0.0.3 on the same
// port is refused and reported, and never accepts.
TEST(TransparentEgress, LandlockOnlyDirectConnectIsDecidedToo) {
  if (Python().empty()) GTEST_SKIP() << "not applicable here: python3 is not installed";
  Sandbox sb;
  RunResult check = RunCommand(sb.AgentboxCommand({"check", "--backend", "landlock"}));
  if (!Contains(check.out, "backend: landlock-only")) {
    std::string line;
    for (const auto& l : Lines(check.out + check.err)) {
      if (Contains(l, "backend")) line = l;
    }
    GTEST_SKIP() << "not applicable here: agentbox check --backend landlock says: " << line;
  }
  HostScript servers(sb, "two_servers.py", kTwoLoopbackServers, {});
  ASSERT_GT(servers.port(), 0) << servers.Output();
  const std::string port = std::to_string(servers.port());
  WriteFile(sb.scratch() + "/policy.yaml",
            "version: 1\nmode: workspace-write\nnetwork:\n  allow: [\"127.0.0.2:" + port + "\"]\n");
  const std::string script =
      "import socket\n"
      "for host in ('127.0.0.2', '127.0.0.3'):\n"
      "    try:\n"
      "        s = socket.create_connection((host, " + port + "), timeout=10)\n"
      "        print(host, s.makefile('rb').read().decode().strip())\n"
      "    except OSError as e: print(host, 'errno', e.errno)\n";
  WriteFile(sb.ws() + "/direct.py", script);
  RunResult r = sb.Sh(kNoProxy + "python3 direct.py",
                      {"--backend", "landlock", "--require", "partial", "--policy", sb.scratch() + "/policy.yaml"});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(Lines(r.out), (std::vector<std::string>{"127.0.0.2 hello from 127.0.0.2", "127.0.0.3 errno 111"}))
      << r.Describe();
  EXPECT_NE(NetDenial(r, "connect", "127.0.0.3:" + port), nullptr) << r.Describe();
  EXPECT_EQ(NetDenial(r, "connect", "127.0.0.2:" + port), nullptr) << r.Describe();
  const std::string out = servers.Output("", 300);
  EXPECT_EQ(CountLines(out, "ACCEPT 127.0.0.3"), 0) << out;
  EXPECT_EQ(CountLines(out, "ACCEPT 127.0.0.2"), 1) << out;
}

}  // namespace
}  // namespace agentbox::e2e
