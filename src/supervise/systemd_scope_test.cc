// `run --systemd-scope`'s decision over a fake environment: a tree with (or
// without) the user manager's sockets and systemd-run, and the loop guard.
// The real path needs a systemd user manager, which not every host has.
#include "supervise/systemd_scope.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "linux/fd.h"

namespace agentbox::supervise {
namespace {

namespace fs = std::filesystem;

class FakeSession : public ::testing::Test {
 protected:
  FakeSession() {
    char tmpl[] = "/tmp/agentbox-scopefake.XXXXXX";
    root_ = mkdtemp(tmpl);
  }
  ~FakeSession() override { fs::remove_all(root_); }
  // A unix socket bound at `path` (beneath the fake root).
  void Socket(const std::string& path) {
    fs::create_directories(fs::path(root_ + path).parent_path());
    linux::UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(fd.valid());
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string real = root_ + path;
    ASSERT_LT(real.size(), sizeof(addr.sun_path));
    std::memcpy(addr.sun_path, real.c_str(), real.size() + 1);
    ASSERT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << real;
  }
  void Program(const std::string& path) {
    fs::create_directories(fs::path(root_ + path).parent_path());
    std::ofstream(root_ + path) << "#!/bin/sh\n";
    fs::permissions(root_ + path, fs::perms::owner_all);
  }
  std::string root_;
};

TEST_F(FakeSession, ReexecWhereTheUserManagerAndSystemdRunAreThere) {
  Socket("/run/user/1000/systemd/private");
  Program("/usr/bin/systemd-run");
  auto p = ProbeSystemdScope({{"XDG_RUNTIME_DIR", "/run/user/1000"}, {"PATH", "/usr/local/bin:/usr/bin"}}, root_);
  EXPECT_EQ(p.answer, SystemdScopeProbe::Answer::kReexec) << p.reason;
  EXPECT_EQ(p.systemd_run, "/usr/bin/systemd-run");
  EXPECT_EQ(p.reason, "systemd user manager at /run/user/1000/systemd/private");
  EXPECT_EQ(SystemdScopeArgv(p.systemd_run, "/usr/bin/agentbox", {"run", "--memory", "1Gi", "--", "make"}),
            (std::vector<std::string>{"/usr/bin/systemd-run", "--user", "--scope", "-p", "Delegate=yes", "--quiet",
                                      "--", "/usr/bin/agentbox", "run", "--memory", "1Gi", "--", "make"}));
}

TEST_F(FakeSession, TheUserBusServesToo) {
  Socket("/run/user/1000/bus");
  Program("/usr/bin/systemd-run");
  auto p = ProbeSystemdScope({{"DBUS_SESSION_BUS_ADDRESS", "unix:path=/run/user/1000/bus,guid=x"},
                              {"PATH", "/usr/bin"}},
                             root_);
  EXPECT_EQ(p.answer, SystemdScopeProbe::Answer::kReexec) << p.reason;
  EXPECT_EQ(p.reason, "user D-Bus at unix:path=/run/user/1000/bus,guid=x");
}

TEST_F(FakeSession, NoUserManagerIsSaidWithWhatWasLookedFor) {
  Program("/usr/bin/systemd-run");
  auto none = ProbeSystemdScope({{"PATH", "/usr/bin"}}, root_);
  EXPECT_EQ(none.answer, SystemdScopeProbe::Answer::kUnavailable);
  EXPECT_EQ(none.reason, "no systemd user manager (XDG_RUNTIME_DIR is unset, DBUS_SESSION_BUS_ADDRESS is unset)");
  // A plain file where the socket should be is no manager.
  Program("/run/user/1000/systemd/private");
  auto file = ProbeSystemdScope({{"XDG_RUNTIME_DIR", "/run/user/1000"}, {"PATH", "/usr/bin"}}, root_);
  EXPECT_EQ(file.answer, SystemdScopeProbe::Answer::kUnavailable);
  EXPECT_NE(file.reason.find("no socket at /run/user/1000/systemd/private or /run/user/1000/bus"), std::string::npos)
      << file.reason;
}

TEST_F(FakeSession, NoSystemdRunOnPath) {
  Socket("/run/user/1000/systemd/private");
  Program("/opt/bin/systemd-run");
  auto p = ProbeSystemdScope({{"XDG_RUNTIME_DIR", "/run/user/1000"}, {"PATH", "/usr/bin:relative/opt/bin"}}, root_);
  EXPECT_EQ(p.answer, SystemdScopeProbe::Answer::kUnavailable);
  EXPECT_NE(p.reason.find("but no systemd-run on PATH"), std::string::npos) << p.reason;
}

TEST_F(FakeSession, TheReexecutedProcessNeverReexecutesAgain) {
  Socket("/run/user/1000/systemd/private");
  Program("/usr/bin/systemd-run");
  auto p = ProbeSystemdScope(
      {{"XDG_RUNTIME_DIR", "/run/user/1000"}, {"PATH", "/usr/bin"}, {"AGENTBOX_SYSTEMD_SCOPE", "1"}}, root_);
  EXPECT_EQ(p.answer, SystemdScopeProbe::Answer::kAlreadyInScope) << p.reason;
  EXPECT_TRUE(p.systemd_run.empty());
}

// This host's own answer, for the record: the real re-execution needs a
// systemd user manager.
TEST(SystemdScopeHere, RealUserManager) {
  auto env = CurrentEnvironment();
  env.erase(kSystemdScopeEnv);
  auto p = ProbeSystemdScope(env);
  if (p.answer != SystemdScopeProbe::Answer::kReexec) GTEST_SKIP() << "not applicable here: " << p.reason;
  EXPECT_FALSE(p.systemd_run.empty());
}

}  // namespace
}  // namespace agentbox::supervise
