// Pathname unix sockets: a same-uid service behind a socket (agentbox's own
// daemon, a session bus, an ssh agent) would act for the sandbox outside
// every fence. On both backends, connect() to a socket bound outside the
// sandbox is refused and reported by path, unless filesystem.unix_sockets
// names it; the sandbox's own listeners stay reachable.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "harness.h"

namespace agentbox::e2e {
namespace {

// A listening unix socket bound by the test (the host side).
class HostListener {
 public:
  explicit HostListener(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un a {};
    a.sun_family = AF_UNIX;
    path.copy(a.sun_path, sizeof(a.sun_path) - 1);
    ok_ = fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && listen(fd_, 16) == 0;
  }
  ~HostListener() {
    if (fd_ >= 0) close(fd_);
    unlink(path_.c_str());
  }
  bool ok() const { return ok_; }
  // Connections that reached the listener, and what the first one sent.
  int Accepted(std::string* first_data = nullptr) {
    int n = 0;
    for (;;) {
      int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return n;
      if (n == 0 && first_data) {
        char buf[256];
        ssize_t r = read(c, buf, sizeof(buf));
        if (r > 0) first_data->assign(buf, static_cast<size_t>(r));
      }
      close(c);
      ++n;
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool ok_ = false;
};

// Tries each path in order; prints "PATH ok" or "PATH errno=N"; exits 1
// when any connect failed.
const char kConnect[] =
    "import socket, sys\n"
    "bad = 0\n"
    "for p in sys.argv[1:]:\n"
    "    s = socket.socket(socket.AF_UNIX)\n"
    "    try:\n"
    "        s.connect(p); s.sendall(b'hello'); print('%s ok' % p)\n"
    "    except OSError as e:\n"
    "        print('%s errno=%d' % (p, e.errno)); bad = 1\n"
    "sys.exit(bad)\n";

std::vector<std::string> ConnectDenials(const RunResult& r) {
  std::vector<std::string> out;
  if (!r.report || !(*r.report)["denials"].is_array()) return out;
  for (const auto& d : (*r.report)["denials"]) {
    if (d.value("facet", "") == "filesystem" && d.value("op", "") == "connect" && d.value("source", "") == "seccomp") {
      out.push_back(d.value("target", ""));
    }
  }
  return out;
}

bool Has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

struct Backend {
  const char* name;
  std::vector<std::string> options;
};

void PrintTo(const Backend& b, std::ostream* os) { *os << b.name; }

class UnixSockets : public testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    ASSERT_FALSE(FindTool("python3").empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  }
  std::vector<std::string> Options(const std::vector<std::string>& more = {}) const {
    std::vector<std::string> o = GetParam().options;
    o.insert(o.end(), more.begin(), more.end());
    return o;
  }
  bool landlock_only() const { return std::string(GetParam().name) == "landlock"; }
};

TEST_P(UnixSockets, HostServicesAreRefusedAndNamed) {
  Sandbox box;
  // A real agentbox daemon with its socket in the workspace, a session-bus
  // stand-in and an ssh-agent stand-in.
  // Its state directory is agentbox's own and hidden in any case (see
  // own_state_test.cc); its socket, placed in the workspace, is not.
  const std::string state = box.scratch() + "/state";
  MakeDirs(state, 0700);
  const std::string daemon_sock = box.ws() + "/agentbox.sock";
  Command serve = box.AgentboxCommand({"serve", "--state-dir", state, "--socket", daemon_sock});
  Process daemon(serve);
  ASSERT_TRUE(daemon.started()) << daemon.start_error();
  for (int i = 0; i < 200 && !Exists(daemon_sock); ++i) usleep(25000);
  ASSERT_TRUE(Exists(daemon_sock)) << "the daemon did not create its socket";
  HostListener bus(box.ws() + "/bus");
  HostListener agent(box.ws() + "/agent.sock");
  ASSERT_TRUE(bus.ok() && agent.ok());
  ASSERT_EQ(symlink("agent.sock", (box.ws() + "/link.sock").c_str()), 0);
  std::vector<std::string> targets = {daemon_sock, box.ws() + "/bus", "agent.sock", "link.sock"};
  // Outside every tree the sandbox sees: absent on the namespaces backend,
  // visible (Landlock does not fence connect) on the landlock-only one.
  HostListener outside(box.scratch() + "/outside.sock");
  ASSERT_TRUE(outside.ok());
  targets.push_back(box.scratch() + "/outside.sock");

  std::vector<std::string> argv = {"python3", "-c", kConnect};
  argv.insert(argv.end(), targets.begin(), targets.end());
  RunResult r = box.RunArgv(argv, Options());
  kill(daemon.pid(), SIGTERM);
  daemon.Wait();

  EXPECT_EQ(r.status, 1) << r.Describe();
  for (size_t i = 0; i + 1 < targets.size(); ++i) {
    EXPECT_TRUE(Contains(r.out, targets[i] + " errno=13")) << targets[i] << "\n" << r.Describe();
  }
  const auto denied = ConnectDenials(r);
  EXPECT_TRUE(Has(denied, daemon_sock)) << r.Describe();
  EXPECT_TRUE(Has(denied, box.ws() + "/bus")) << r.Describe();
  EXPECT_TRUE(Has(denied, "agent.sock")) << r.Describe();
  EXPECT_TRUE(Has(denied, "link.sock")) << r.Describe();
  if (landlock_only()) {
    EXPECT_TRUE(Contains(r.out, box.scratch() + "/outside.sock errno=13")) << r.Describe();
    EXPECT_TRUE(Has(denied, box.scratch() + "/outside.sock")) << r.Describe();
  } else {
    EXPECT_TRUE(Contains(r.out, box.scratch() + "/outside.sock errno=2")) << r.Describe();
  }
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
  EXPECT_EQ(bus.Accepted(), 0);
  EXPECT_EQ(agent.Accepted(), 0);
  EXPECT_EQ(outside.Accepted(), 0);
  // The report says how connect() is fenced.
  ASSERT_TRUE(r.report.has_value());
  bool mechanism = false;
  for (const auto& m : (*r.report)["enforcement"]["facets"]["filesystem"]["mechanisms"]) {
    mechanism = mechanism || m == "seccomp-unix-connect";
  }
  EXPECT_TRUE(mechanism) << r.Describe();
}

TEST_P(UnixSockets, ASocketThePolicyNamesIsReachable) {
  Sandbox box;
  // One in the workspace, one outside every mounted tree (bound in by the
  // namespaces backend at its own path).
  HostListener inside(box.ws() + "/agent.sock");
  HostListener outside(box.scratch() + "/named.sock");
  HostListener other(box.scratch() + "/other.sock");
  ASSERT_TRUE(inside.ok() && outside.ok() && other.ok());
  const std::string policy = box.scratch() + "/policy.yaml";
  WriteFile(policy, "version: 1\nfilesystem:\n  unix_sockets: [" + box.ws() + "/agent.sock, " + box.scratch() +
                        "/named.sock]\n");
  RunResult r = box.RunArgv({"python3", "-c", kConnect, "agent.sock", box.scratch() + "/named.sock"},
                            Options({"--policy", policy}));
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "agent.sock ok")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, box.scratch() + "/named.sock ok")) << r.Describe();
  EXPECT_TRUE(ConnectDenials(r).empty()) << r.Describe();
  std::string data;
  EXPECT_EQ(inside.Accepted(&data), 1);
  EXPECT_EQ(data, "hello");
  EXPECT_EQ(outside.Accepted(&data), 1);
  EXPECT_EQ(data, "hello");
  // A neighbour of a named socket is not named.
  RunResult r2 = box.RunArgv({"python3", "-c", kConnect, box.scratch() + "/other.sock"}, Options({"--policy", policy}));
  EXPECT_EQ(r2.status, 1) << r2.Describe();
  EXPECT_EQ(other.Accepted(), 0);
}

// A seccomp notification names the calling thread, not its process: every
// connect() and listen() of a multi-threaded program (libuv, Go, Java,
// Python's threads) comes from a thread other than the main one. Decided
// there exactly as on the main thread: a named socket and the sandbox's own
// are reached, another is refused and reported.
TEST_P(UnixSockets, CallsFromAWorkerThreadAreDecidedAsAnyOther) {
  Sandbox box;
  HostListener named(box.scratch() + "/named.sock");
  HostListener other(box.ws() + "/other.sock");
  ASSERT_TRUE(named.ok() && other.ok());
  const std::string policy = box.scratch() + "/policy.yaml";
  WriteFile(policy, "version: 1\nfilesystem:\n  unix_sockets: [" + box.scratch() + "/named.sock]\n");
  const char kThreaded[] =
      "import os, socket, sys, threading\n"
      "def connect(name, p):\n"
      "    s = socket.socket(socket.AF_UNIX)\n"
      "    try:\n"
      "        s.connect(p); s.sendall(b'hello'); print(name, 'ok')\n"
      "    except OSError as e:\n"
      "        print(name, 'errno=%d' % e.errno)\n"
      "def own():\n"
      "    p = os.path.join(os.environ.get('TMPDIR', '/tmp'), 'thread.sock')\n"
      "    srv = socket.socket(socket.AF_UNIX)\n"
      "    try:\n"
      "        srv.bind(p); srv.listen(1)\n"
      "        c = socket.socket(socket.AF_UNIX); c.connect(p); c.sendall(b'x')\n"
      "        print('own', 'ok' if srv.accept()[0].recv(1) == b'x' else 'short')\n"
      "    except OSError as e:\n"
      "        print('own', 'errno=%d' % e.errno)\n"
      "    os.unlink(p)\n"
      "def worker(f, *args):\n"
      "    if threading.get_native_id() == os.getpid(): print('not a worker thread')\n"
      "    f(*args)\n"
      "for args in ((connect, 'named', sys.argv[1]), (connect, 'other', sys.argv[2]), (own,)):\n"
      "    t = threading.Thread(target=worker, args=args); t.start(); t.join()\n";
  RunResult r = box.RunArgv({"python3", "-c", kThreaded, box.scratch() + "/named.sock", "other.sock"},
                            Options({"--policy", policy}));
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(Lines(r.out), (std::vector<std::string>{"named ok", "other errno=13", "own ok"})) << r.Describe();
  std::string data;
  EXPECT_EQ(named.Accepted(&data), 1);
  EXPECT_EQ(data, "hello");
  EXPECT_EQ(other.Accepted(), 0);
  EXPECT_EQ(ConnectDenials(r), std::vector<std::string>{"other.sock"}) << r.Describe();
}

TEST_P(UnixSockets, TheSandboxsOwnListenersAreReachable) {
  Sandbox box;
  // A server inside the sandbox (in $TMPDIR, and in the workspace), a
  // client inside: both ends are the sandbox's.
  const char kServer[] =
      "import os, socket, threading\n"
      "for d in (os.environ.get('TMPDIR', '/tmp'), os.getcwd()):\n"
      "    p = os.path.join(d, 'own.sock')\n"
      "    srv = socket.socket(socket.AF_UNIX); srv.bind(p); srv.listen(1)\n"
      "    def serve():\n"
      "        c, _ = srv.accept(); c.sendall(c.recv(16).upper()); c.close()\n"
      "    t = threading.Thread(target=serve); t.start()\n"
      "    cl = socket.socket(socket.AF_UNIX); cl.connect(p); cl.sendall(b'ping')\n"
      "    print(d == os.getcwd() and 'workspace' or 'tmp', cl.recv(16).decode())\n"
      "    t.join(); srv.close(); os.unlink(p)\n"
      "a, b = socket.socketpair(); a.sendall(b'pair'); print('socketpair', b.recv(4).decode())\n";
  RunResult r = box.RunArgv({"python3", "-c", kServer}, Options());
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "tmp PING")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "workspace PING")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "socketpair pair")) << r.Describe();
  EXPECT_TRUE(ConnectDenials(r).empty()) << r.Describe();
}

TEST_P(UnixSockets, DatagramSocketsAreRefused) {
  Sandbox box;
  const char kDgram[] =
      "import socket\n"
      "for name, make in (('socket', lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)),\n"
      "                   ('socketpair', lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM))):\n"
      "    try:\n"
      "        make(); print(name, 'made')\n"
      "    except OSError as e:\n"
      "        print(name, 'errno=%d' % e.errno)\n";
  RunResult r = box.RunArgv({"python3", "-c", kDgram}, Options());
  EXPECT_TRUE(Contains(r.out, "socket errno=1")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "socketpair errno=1")) << r.Describe();
  ASSERT_TRUE(r.report.has_value()) << r.Describe();
  int socket_denials = 0;
  for (const auto& d : (*r.report)["denials"]) {
    if (d.value("source", "") == "seccomp" && (d.value("op", "") == "socket" || d.value("op", "") == "socketpair")) {
      ++socket_denials;
    }
  }
  EXPECT_EQ(socket_denials, 2) << r.Describe();
}

// A TCP connect still goes through: the runner makes it on the command's
// own socket (a listener the sandbox opens on its loopback).
TEST_P(UnixSockets, InternetSocketsStillConnect) {
  Sandbox box;
  const char kTcp[] =
      "import socket, threading\n"
      "srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen(1)\n"
      "t = threading.Thread(target=lambda: srv.accept()[0].sendall(b'tcp-ok')); t.start()\n"
      "c = socket.create_connection(srv.getsockname()); print(c.recv(8).decode()); t.join()\n"
      "n = socket.socket(); n.setblocking(False)\n"
      "try:\n"
      "    n.connect(srv.getsockname())\n"
      "except BlockingIOError:\n"
      "    pass\n"
      "print('nonblocking ok')\n";
  RunResult r = box.RunArgv({"python3", "-c", kTcp}, Options());
  if (landlock_only()) {
    // No network namespace: Landlock refuses every TCP bind and connect.
    EXPECT_NE(r.status, 0) << r.Describe();
    return;
  }
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "tcp-ok")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "nonblocking ok")) << r.Describe();
}

// The second fence: even through a socket the policy names, the daemon
// refuses a process that runs inside a sandbox, and says so. A client that
// some other tool contains (here: unshare's user and pid namespaces) is
// served.
TEST_P(UnixSockets, TheDaemonRefusesSandboxedPeers) {
  ASSERT_FALSE(FindTool("curl").empty()) << "curl is missing (scripts/install-deps.sh installs it)";
  Sandbox box;
  const std::string state = box.scratch() + "/state";
  MakeDirs(state, 0700);
  const std::string sock = state + "/agentbox.sock";
  Process daemon(box.AgentboxCommand({"serve", "--state-dir", state, "--socket", sock}));
  ASSERT_TRUE(daemon.started()) << daemon.start_error();
  for (int i = 0; i < 200 && !Exists(sock); ++i) usleep(25000);
  ASSERT_TRUE(Exists(sock)) << "the daemon did not create its socket";
  const std::string policy = box.scratch() + "/policy.yaml";
  WriteFile(policy, "version: 1\nfilesystem:\n  unix_sockets: [" + sock + "]\n");
  const std::string curl = "curl -sS --unix-socket " + sock + " http://agentbox/v1/health";
  RunResult r = box.Sh(curl + "; echo; echo curl=$?", Options({"--policy", policy}));
  Command contained;
  contained.argv = {FindTool("unshare"), "-Urpf", "--mount-proc", "sh", "-c", curl};
  contained.env = box.Env();
  RunResult other = RunCommand(contained);
  Command direct;
  direct.argv = {"/bin/sh", "-c", curl};
  direct.env = box.Env();
  RunResult plain = RunCommand(direct);
  kill(daemon.pid(), SIGTERM);
  daemon.Wait();
  EXPECT_TRUE(Contains(r.out, "inside an agentbox sandbox")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "forbidden")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "\"ok\"")) << r.Describe();
  EXPECT_TRUE(ConnectDenials(r).empty()) << r.Describe();
  EXPECT_FALSE(Contains(plain.out, "forbidden")) << plain.Describe();
  EXPECT_TRUE(Contains(plain.out, "ok")) << plain.Describe();
  EXPECT_FALSE(Contains(other.out, "forbidden")) << other.Describe();
  EXPECT_TRUE(Contains(other.out, "ok")) << other.Describe();
}

// Landlock-only: the runner is not the command's pid-namespace init, so the
// command must not be able to signal it (and so leave its tree).
TEST(UnixSocketsLandlockOnly, TheCommandCannotSignalItsRunner) {
  Sandbox box;
  RunResult probe = box.Sh("true", {"--backend", "landlock", "--require", "partial"});
  ASSERT_EQ(probe.status, 0) << probe.Describe();
  bool scoped = false;
  for (const auto& m : (*probe.report)["enforcement"]["facets"]["processes"]["mechanisms"]) {
    scoped = scoped || m == "landlock-scope-signals";
  }
  if (!scoped) GTEST_SKIP() << "not applicable here: Landlock below ABI 6 has no signal scoping";
  RunResult r = box.Sh("kill -USR1 $PPID; echo rc=$?", {"--backend", "landlock", "--require", "partial"});
  EXPECT_TRUE(Contains(r.out, "rc=1")) << r.Describe();
  EXPECT_EQ(r.status, 0) << r.Describe();
}

// A blocking connect that cannot finish at once is waited for on a thread of
// the runner's; at the sandbox's process limit (pids.max, or RLIMIT_NPROC in
// its user namespace: both count threads) there is none to spare. The call
// must fail with EAGAIN, as a fork does there, and the runner live on.
TEST(UnixSocketsAtTheProcessLimit, ABlockingConnectFailsWithEagainAndTheRunEndsCleanly) {
  Sandbox box;
  if (!CgroupsExpected({"pids"}) && !NprocCapsUserNamespace()) {
    RunResult refused = box.Sh("true", {"--max-processes", "24"});
    EXPECT_EQ(refused.status, 125) << refused.Describe();
    return;
  }
  const char kScript[] =
      "import os, socket, struct, time\n"
      "p = os.path.join(os.environ.get('TMPDIR', '/tmp'), 'full.sock')\n"
      "srv = socket.socket(socket.AF_UNIX); srv.bind(p); srv.listen(0)\n"
      "held = []\n"
      "for i in range(8):\n"
      "    c = socket.socket(socket.AF_UNIX); c.setblocking(False)\n"
      "    try:\n"
      "        c.connect(p); held.append(c)\n"
      "    except OSError:\n"
      "        break\n"
      "kids = []\n"
      "while True:\n"
      "    try:\n"
      "        pid = os.fork()\n"
      "    except OSError:\n"
      "        break\n"
      "    if pid == 0:\n"
      "        time.sleep(60); os._exit(0)\n"
      "    kids.append(pid)\n"
      "c = socket.socket(socket.AF_UNIX)\n"
      "c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack('ll', 2, 0))\n"
      "try:\n"
      "    c.connect(p); print('connect ok')\n"
      "except OSError as e:\n"
      "    print('connect errno=%d' % e.errno)\n"
      "for k in kids:\n"
      "    os.kill(k, 9); os.waitpid(k, 0)\n"
      "print('forked', len(kids))\n";
  RunResult r = box.RunArgv({"python3", "-c", kScript}, {"--max-processes", "24", "--timeout", "60s"});
  ASSERT_TRUE(r.report) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << r.Describe();
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "connect errno=11")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "forked ")) << r.Describe();
}

INSTANTIATE_TEST_SUITE_P(Backends, UnixSockets,
                         testing::Values(Backend{"namespaces", {}},
                                         Backend{"landlock", {"--backend", "landlock", "--require", "partial"}}),
                         [](const testing::TestParamInfo<Backend>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace agentbox::e2e
