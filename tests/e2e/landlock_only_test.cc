// The landlock-only backend, forced on this host with `--backend landlock`:
// refused under `--require full`, and under `--require partial` Landlock,
// seccomp and the runner's clean-up hold without any namespace.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "harness.h"

namespace agentbox::e2e {
namespace {

bool HavePython() { return !FindTool("python3").empty(); }

std::string Backend(const RunResult& r) {
  if (!r.report || !(*r.report)["enforcement"].is_object()) return "";
  return (*r.report)["enforcement"].value("backend", "");
}

TEST(LandlockOnly, RefusedUnderRequireFullWithTheMissingList) {
  Sandbox box;
  RunResult r = box.Sh("echo ran", {"--backend", "landlock"});
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "ran"));
  for (const char* want : {"requires full enforcement", "processes:", "network:", "no private /tmp"}) {
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
  EXPECT_TRUE(Contains(r.out, "connect=13")) << r.Describe();  // EACCES from Landlock
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
