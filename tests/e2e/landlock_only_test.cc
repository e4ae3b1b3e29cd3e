// The landlock-only backend, forced on this host with `--backend landlock`:
// refused under `--require full`, and under `--require partial` Landlock,
// seccomp and the runner's clean-up hold without any namespace.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "harness.h"
#include "net_fixtures.h"
#include "linux/fd.h"

namespace agentbox::e2e {
namespace {

std::string Backend(const RunResult& r) {
  if (!r.report || !(*r.report)["enforcement"].is_object()) return "";
  return (*r.report)["enforcement"].value("backend", "");
}

TEST(LandlockOnly, RefusedUnderRequireFullWithTheMissingList) {
  Sandbox box;
  RunResult r = box.Sh("echo ran", {"--backend", "landlock"});
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "ran"));
  // (The network facet is full on Landlock ABI >= 4: not in the list.)
  for (const char* want : {"requires full enforcement", "processes:", "no private /tmp"}) {
    EXPECT_TRUE(Contains(r.err, want)) << want << "\n" << r.Describe();
  }
  EXPECT_EQ(Backend(r), "landlock-only") << r.Describe();
}

TEST(LandlockOnly, FilesystemNetworkProcessesAndCleanUp) {
  ASSERT_TRUE(HavePython()) << "python3 is missing (scripts/install-deps.sh installs it)";
  Sandbox box;
  // A host TCP listener on loopback, and a host process outside the domain.
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  struct sockaddr_in addr {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  Command host_sleep;
  host_sleep.argv = {FindTool("sleep"), "300"};
  Process victim(host_sleep);
  ASSERT_TRUE(victim.started());
  const std::string marker = std::to_string(700000 + (std::stoul(RandomHex(2), nullptr, 16) % 99999));

  const std::string script =
      "cat " + box.home() + "/.ssh/id_rsa; echo ssh=$?\n"
      "echo x > " + box.scratch() + "/outside; echo outside=$?\n"
      "echo x > ws-file; echo workspace=$?\n"
      "echo t > \"$TMPDIR/t\" && echo tmp=$TMPDIR\n"
      "echo home=$HOME\n"
      "kill -0 " + std::to_string(victim.pid()) + "; echo signal=$?\n"
      "python3 - <<'PY'\n"
      "import ctypes, socket\n"
      "s = socket.socket()\n"
      "try:\n"
      "    s.connect(('127.0.0.1', " + std::to_string(port) + ")); print('connect=ok')\n"
      "except OSError as e: print('connect=%d' % e.errno)\n"
      "libc = ctypes.CDLL(None, use_errno=True)\n"
      "print('unshare=%d/%d' % (libc.unshare(0x10000000), ctypes.get_errno()))\n"
      // io_uring_setup has no libc wrapper; 425 is its number on every
      // architecture (numbers from 424 on are shared by all tables).
      "print('io_uring=%d/%d' % (libc.syscall(425, 1, 0), ctypes.get_errno()))\n"
      "print('ptrace=%d/%d' % (libc.ptrace(0, 0, 0, 0), ctypes.get_errno()))\n"
      "PY\n"
      "(setsid sleep " + marker + " </dev/null >/dev/null 2>&1 &)\n"
      "echo done\n";
  RunResult r = box.Sh(script, {"--backend", "landlock", "--require", "partial"});
  close(listener);
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "done")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, box.ssh_secret())) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "Permission denied")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "ssh=1")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "outside=2")) << r.Describe();
  EXPECT_FALSE(Exists(box.scratch() + "/outside"));
  EXPECT_TRUE(Contains(r.out, "workspace=0")) << r.Describe();
  EXPECT_EQ(ReadFile(box.ws() + "/ws-file").value_or(""), "x\n");
  EXPECT_TRUE(Contains(r.out, "signal=1")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "connect=111")) << r.Describe();  // ECONNREFUSED from the connect() broker
  EXPECT_TRUE(Contains(r.out, "unshare=-1/1")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "io_uring=-1/1")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "ptrace=-1/1")) << r.Describe();
  EXPECT_EQ(Backend(r), "landlock-only");
  EXPECT_EQ(EnforcementLevel(r), "partial");
  // TMPDIR and HOME were in the private directory, which is gone now.
  std::string tmp;
  for (const auto& line : Lines(r.out)) {
    if (line.rfind("tmp=", 0) == 0) tmp = line.substr(4);
  }
  ASSERT_FALSE(tmp.empty()) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "home=" + tmp.substr(0, tmp.size() - 4) + "/home")) << r.Describe();
  EXPECT_FALSE(Exists(tmp.substr(0, tmp.size() - 4))) << tmp;
  // The detached background process was killed with the run.
  EXPECT_TRUE(WaitUntilNoProcess("sleep " + marker, 30000));
  // The host process outside the domain is untouched.
  EXPECT_EQ(kill(victim.pid(), 0), 0);
}

// ------------------------------------------------------------------ network
//
// No network namespace: the host's own 127.0.0.1 is what the sandbox sees.
// Landlock (TCP connect and bind, one port allowed: the proxy's), the
// seccomp socket filter (no UDP, raw, ICMP or other protocols) and the
// runner's connect() mediation (inet: only the proxy's address) fence it.

const std::vector<std::string> kLandlockPartial = {"--backend", "landlock", "--require", "partial"};

std::vector<std::string> LandlockWith(std::vector<std::string> more) {
  std::vector<std::string> args = kLandlockPartial;
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// The report's network denial with `op` whose target is `target`, or null.
const nlohmann::json* NetworkDenial(const RunResult& r, const std::string& op, const std::string& target) {
  if (!r.report || !(*r.report)["denials"].is_array()) return nullptr;
  for (const auto& d : (*r.report)["denials"]) {
    if (d["facet"] == "network" && d["op"] == op && d["target"] == target) return &d;
  }
  return nullptr;
}

TEST(LandlockOnlyNetwork, DirectTcpToAHostLoopbackServiceIsDeniedAndReported) {
  ASSERT_TRUE(HavePython()) << "python3 is missing (scripts/install-deps.sh installs it)";
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox box;
  RunResult r = box.RunArgv({"python3", "-c",
                             "import socket\n"
                             "for family, host in ((socket.AF_INET, '127.0.0.1'), (socket.AF_INET6, '::ffff:127.0.0.1')):\n"
                             "    s = socket.socket(family)\n"
                             "    try:\n"
                             "        s.connect((host, " + std::to_string(server.port()) + ")); print('connect=ok')\n"
                             "    except OSError as e: print('connect=%d' % e.errno)\n"},
                            kLandlockPartial);
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(Lines(r.out), (std::vector<std::string>{"connect=111", "connect=111"})) << r.Describe();
  EXPECT_EQ(server.served(), 0);
  // The v4-mapped form is decided, and named, as the address it carries.
  const nlohmann::json* d = NetworkDenial(r, "connect", server.target());
  ASSERT_NE(d, nullptr) << r.Describe();
  EXPECT_EQ((*d)["source"], "broker") << r.Describe();
  EXPECT_EQ((*d)["count"], 2) << r.Describe();
  ASSERT_TRUE(r.report);
  const auto& net = (*r.report)["enforcement"]["facets"]["network"];
  EXPECT_EQ(net["level"], "full") << r.Describe();
  EXPECT_EQ(net["mechanisms"], nlohmann::json({"landlock-net-tcp", "seccomp-socket-filter", "connect-mediation"}))
      << r.Describe();
}

// UDP, ICMP (ping sockets), raw, SCTP, netlink (but NETLINK_ROUTE, which
// only reads) and packet sockets: none is made. A TCP socket may not listen (listen() would bind it to a port on
// every interface of the host).
TEST(LandlockOnlyNetwork, UdpAndEveryOtherProtocolAreDenied) {
  ASSERT_TRUE(HavePython()) << "python3 is missing (scripts/install-deps.sh installs it)";
  linux::UniqueFd udp(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(udp.valid());
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(udp.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(getsockname(udp.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  // Control: from the host, a datagram does arrive.
  char buf[64];
  ASSERT_EQ(sendto(udp.get(), "c", 1, 0, reinterpret_cast<sockaddr*>(&a), sizeof a), 1);
  pollfd p = {udp.get(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 2000), 1);
  ASSERT_EQ(recv(udp.get(), buf, sizeof buf, 0), 1);

  Sandbox box;
  RunResult r = box.RunArgv(
      {"python3", "-c",
       "import socket\n"
       "def attempt(name, make):\n"
       "    try:\n"
       "        make(); print(name + '=ok')\n"
       "    except OSError as e: print('%s=%d' % (name, e.errno))\n"
       "attempt('udp', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', " +
           std::to_string(port) + ")))\n"
       "attempt('udp6', lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))\n"
       "attempt('udp-proto', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP))\n"
       "attempt('ping', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP))\n"
       "attempt('raw', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))\n"
       "attempt('sctp', lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 132))\n"
       "attempt('seqpacket', lambda: socket.socket(socket.AF_INET, socket.SOCK_SEQPACKET, 132))\n"
       "attempt('netlink', lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 9))\n"  // NETLINK_AUDIT
       "attempt('netlink-route', lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))\n"
       "attempt('packet', lambda: socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, 0))\n"
       "attempt('listen', lambda: socket.socket().listen())\n"
       "attempt('tcp', lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP))\n"},
      kLandlockPartial);
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(Lines(r.out), (std::vector<std::string>{"udp=1", "udp6=1", "udp-proto=1", "ping=1", "raw=1", "sctp=1",
                                                    "seqpacket=1", "netlink=1", "netlink-route=ok", "packet=1",
                                                    "listen=13", "tcp=ok"}))
      << r.Describe();
  // Loopback delivery happens inside sendto: had anything arrived, it would be queued now.
  EXPECT_EQ(recv(udp.get(), buf, sizeof buf, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN);
  const nlohmann::json* d = NetworkDenial(r, "socket", "AF_INET SOCK_DGRAM");
  ASSERT_NE(d, nullptr) << r.Describe();
  EXPECT_EQ((*d)["source"], "seccomp") << r.Describe();
  EXPECT_NE(NetworkDenial(r, "listen", "AF_INET"), nullptr) << r.Describe();
}

TEST(LandlockOnlyNetwork, AllowedHostThroughTheProxy) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox box;
  RunResult r = box.Sh("echo \"proxy=$HTTP_PROXY\"; curl -s -m 10 " + server.url(),
                       LandlockWith({"--allow-domain", server.target()}));
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, HostServer::kBody)) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "proxy=http://127.0.0.1:")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "proxy=http://127.0.0.1:3128\n")) << r.Describe();  // ephemeral, not fixed
  EXPECT_EQ(server.served(), 1);
  ASSERT_TRUE(r.report);
  EXPECT_EQ((*r.report)["network"]["connections"]["allowed"], 1) << r.Describe();
  const auto& net = (*r.report)["enforcement"]["facets"]["network"];
  EXPECT_EQ(net["level"], "full") << r.Describe();
  EXPECT_EQ(net["mechanisms"], nlohmann::json({"landlock-net-tcp", "seccomp-socket-filter", "connect-mediation",
                                               "egress-proxy"}))
      << r.Describe();
  for (const auto& m : (*r.report)["enforcement"]["missing"]) {
    EXPECT_NE(m["facet"], "network") << r.Describe();
  }
}

// From a worker thread (where libuv, Go and Java make their connects) as
// from the main one: the proxy is reached, and so is the allowed host
// directly, through the connect() broker (one record each).
TEST(LandlockOnlyNetwork, ConnectsFromAWorkerThreadReachTheProxyAndNothingElse) {
  ASSERT_TRUE(HavePython()) << "python3 is missing (scripts/install-deps.sh installs it)";
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox box;
  WriteFile(box.ws() + "/threaded.py", kThreadedClient);
  RunResult r = box.RunArgv({"python3", "threaded.py", server.url(), server.target()},
                            LandlockWith({"--allow-domain", server.target()}));
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(Lines(r.out), (std::vector<std::string>{std::string("fetch ") + HostServer::kBody, "direct ok"}))
      << r.Describe();
  EXPECT_EQ(server.served(), 2);  // the fetch, and the direct connect
  EXPECT_EQ(NetworkDenial(r, "connect", server.target()), nullptr) << r.Describe();
  ASSERT_TRUE(r.report);
  EXPECT_EQ((*r.report)["network"]["connections"]["allowed"], 2) << r.Describe();
}

TEST(LandlockOnlyNetwork, DeniedHostThroughTheProxyIsRefusedAndReported) {
  HostServer allowed, other;
  ASSERT_GT(allowed.port(), 0);
  ASSERT_GT(other.port(), 0);
  Sandbox box;
  RunResult r = box.Sh("curl -s -i -m 10 " + other.url() + "; echo curl=$?",
                       LandlockWith({"--allow-domain", allowed.target()}));
  EXPECT_TRUE(Contains(r.out, "403")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "X-Agentbox-Denied")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, HostServer::kBody)) << r.Describe();
  EXPECT_EQ(other.served(), 0);
  const nlohmann::json* d = NetworkDenial(r, "connect", other.target());
  ASSERT_NE(d, nullptr) << r.Describe();
  EXPECT_EQ((*d)["source"], "proxy") << r.Describe();
}

// Without the proxy, the allowed host is reached directly (the connect()
// broker opens it), and another port of the same address is refused.
TEST(LandlockOnlyNetwork, DirectConnectsAreDecidedByTheBroker) {
  HostServer server, other;
  ASSERT_GT(server.port(), 0);
  ASSERT_GT(other.port(), 0);
  Sandbox box;
  RunResult r = box.Sh("curl -s -m 5 --noproxy '*' " + server.url() + "; echo curl=$?; curl -s -m 5 --noproxy '*' " +
                           other.url() + "; echo other=$?",
                       LandlockWith({"--allow-domain", server.target()}));
  EXPECT_TRUE(Contains(r.out, HostServer::kBody)) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "curl=0")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "other=7")) << r.Describe();
  EXPECT_EQ(server.served(), 1);
  EXPECT_EQ(other.served(), 0);
  EXPECT_EQ(NetworkDenial(r, "connect", server.target()), nullptr) << r.Describe();
  const nlohmann::json* d = NetworkDenial(r, "connect", other.target());
  ASSERT_NE(d, nullptr) << r.Describe();
  EXPECT_EQ((*d)["source"], "broker") << r.Describe();
}

// The proxy's ports are on the host's loopback, where any local process can
// connect: it serves only connections from the sandbox's own processes.
TEST(LandlockOnlyNetwork, TheProxyServesOnlyTheSandbox) {
  const std::string curl = FindTool("curl");
  ASSERT_FALSE(curl.empty()) << "curl is missing (scripts/install-deps.sh installs it)";
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox box;
  const std::string script =
      "echo \"proxy=$HTTP_PROXY\"\n"
      "i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done\n"
      "curl -s -m 10 " + server.url() + "; echo; echo inside=$?\n";
  std::vector<std::string> args = {"run", "--report", box.report_path()};
  for (const auto& a : LandlockWith({"--allow-domain", server.target()})) args.push_back(a);
  for (const char* a : {"--", "sh", "-c"}) args.push_back(a);
  args.push_back(script);
  Process run(box.AgentboxCommand(args));
  ASSERT_TRUE(run.started()) << run.start_error();
  ASSERT_TRUE(run.WaitForStdout("\n", 15000)) << run.out() << run.err();
  const std::string out = run.out();
  ASSERT_EQ(out.rfind("proxy=http://127.0.0.1:", 0), 0u) << out;
  const std::string proxy = out.substr(6, out.find('\n') - 6);
  // A host process of the same user, through the same proxy, to the allowed host.
  Command outside;
  outside.argv = {curl, "-s", "-m", "10", "-x", proxy, server.url()};
  RunResult host = RunCommand(outside);
  EXPECT_NE(host.status, 0) << host.Describe();
  EXPECT_FALSE(Contains(host.out, HostServer::kBody)) << host.Describe();
  EXPECT_EQ(server.served(), 0);
  WriteFile(box.ws() + "/go", "");
  RunResult r = run.Wait();
  EXPECT_EQ(r.status, 0) << r.Describe();
  // The sandbox itself is served.
  EXPECT_TRUE(Contains(r.out, HostServer::kBody)) << r.Describe();
  EXPECT_EQ(server.served(), 1);
}

TEST(LandlockOnly, CheckNamesTheBackend) {
  Sandbox box;
  RunResult r = RunCommand(box.AgentboxCommand({"check", "--backend", "landlock"}));
  EXPECT_TRUE(Contains(r.out, "backend: landlock-only (forced by --backend landlock)")) << r.Describe();
  RunResult a = RunCommand(box.AgentboxCommand({"check"}));
  EXPECT_TRUE(Contains(a.out, "backend: namespaces (user namespaces available)") ||
              Contains(a.out, "backend: landlock-only (user namespaces unavailable"))
      << a.Describe();
}

}  // namespace
}  // namespace agentbox::e2e
