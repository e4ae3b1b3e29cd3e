// Sessions on sandbox.isolation: container: one long-lived gVisor sandbox
// per session's world, its init agentbox's own binary running the world's
// supervisor on the Sentry, driven through the daemon's API as on the os
// level. The host fact (runsc able to start a sandbox for this user) is
// checked without agentbox; where it is absent each test says "not
// applicable here" and why.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "daemon_fixture.h"
#include "ladder_workloads.h"

namespace agentbox::session_test {
namespace {

using e2e::Contains;
using e2e::GvisorLack;
using e2e::TempDir;

constexpr const char* kGvisorPolicy = "version: 1\nmode: workspace-write\nsandbox: { isolation: container }\n";

class GvisorSession : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!GvisorLack().empty()) GTEST_SKIP() << "not applicable here: " << GvisorLack();
    ASSERT_TRUE(d_.Start()) << d_.error();
  }
  daemon::Client& c() { return d_.client(); }
  std::string Create(const std::string& policy = kGvisorPolicy) {
    return CreateSession(c(), ws_.path(), {{"policy", policy}});
  }

  TempDir ws_{"agentbox-session-ws-"};
  Daemon d_;
};

TEST_F(GvisorSession, OneSandboxServesTheCallsAndTheFileToolsSeeWhatTheShellSees) {
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  // gVisor's kernel says so in its log ("Starting gVisor..."), and its
  // uname is its own (4.4.0), not this host's.
  json first = Bash(c(), id, "dmesg | head -1; echo 1 > /tmp/warm");
  ASSERT_EQ(first.value("kind", ""), "exited") << first.dump();
  EXPECT_TRUE(Contains(Output(first), "gVisor")) << "the call did not run on gVisor's kernel: " << first.dump();
  EXPECT_EQ(first["outcome"]["enforcement"].value("backend", ""), "gvisor") << first.dump();
  const std::vector<pid_t> world = d_.Children();
  ASSERT_FALSE(world.empty());
  for (int i = 0; i < 3; ++i) {
    json r = Bash(c(), id, "cat /tmp/warm");
    EXPECT_EQ(Output(r), "1\n") << "the sandbox's /tmp is gone: a new sandbox per call? " << r.dump();
  }
  EXPECT_EQ(d_.Children(), world) << "the session's sandbox changed between warm calls";

  ASSERT_EQ(Bash(c(), id, "mkdir notes").value("exit_code", -1), 0);
  json w = Execute(c(), id, "write_file", {{"path", "notes/from-tool.txt"}, {"content", "written by the tool\n"}});
  ASSERT_EQ(w.value("is_error", true), false) << w.dump();
  EXPECT_EQ(Output(Bash(c(), id, "cat notes/from-tool.txt")), "written by the tool\n");
  ASSERT_EQ(Bash(c(), id, "printf 'written by the shell\\n' > from-shell.txt").value("exit_code", -1), 0);
  json read = Execute(c(), id, "read_file", {{"path", "from-shell.txt"}});
  EXPECT_TRUE(Contains(Output(read), "written by the shell")) << read.dump();
  json edit = Execute(c(), id, "edit_file", {{"path", "from-shell.txt"}, {"old", "shell"}, {"new", "editor"}});
  EXPECT_EQ(edit.value("is_error", true), false) << edit.dump();
  EXPECT_EQ(Output(Bash(c(), id, "cat from-shell.txt")), "written by the editor\n");
  const std::string big(300000, 'x');
  json wb = Execute(c(), id, "write_file", {{"path", "big.txt"}, {"content", big}});
  ASSERT_EQ(wb.value("is_error", true), false) << wb.dump();
  EXPECT_EQ(Output(Bash(c(), id, "wc -c < big.txt")), "300000\n");
  for (int i = 0; i < 3; ++i) {
    json tail = Bash(c(), id, "head -c 300000 /dev/zero | tr '\\0' y; echo; echo END-OF-OUTPUT");
    const std::string o = Output(tail);
    EXPECT_GE(o.size(), 14u) << tail.dump().substr(0, 400);
    EXPECT_EQ(o.substr(o.size() >= 14 ? o.size() - 14 : 0), "END-OF-OUTPUT\n") << "the output's tail was lost";
  }
  // The workspace is the session's copy: the base is untouched.
  EXPECT_FALSE(e2e::Exists(ws_.path() + "/from-shell.txt"));
}

TEST_F(GvisorSession, SecretsStayAbsentAndNothingOutsideIsWritten) {
  e2e::WriteFile(ws_.path() + "/.env", "TOKEN=do-not-leak\n");
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  json r = Bash(c(), id, "cat .env; cat ~/.ssh/id_rsa; echo out > /etc/agentbox-probe; exit 3");
  EXPECT_EQ(r.value("exit_code", -1), 3) << r.dump();
  EXPECT_FALSE(Contains(Output(r), "do-not-leak")) << r.dump();
  EXPECT_FALSE(e2e::Exists("/etc/agentbox-probe"));
  json tool = Execute(c(), id, "read_file", {{"path", ".env"}});
  EXPECT_FALSE(Contains(Output(tool), "do-not-leak")) << tool.dump();
}

TEST_F(GvisorSession, ATimeoutEndsTheCallNotTheSandbox) {
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  json timed = Execute(c(), id, "bash", {{"command", "sleep 60"}, {"timeout", "2s"}});
  EXPECT_EQ(timed.value("kind", ""), "timed_out") << timed.dump();
  json after = Bash(c(), id, "echo alive");
  EXPECT_EQ(Output(after), "alive\n") << after.dump();
}

TEST_F(GvisorSession, ASnapshotRestoresIntoAFreshSandbox) {
  const std::string a = Create();
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(Bash(c(), a, "echo v1 > state.txt").value("exit_code", -1), 0);
  Answer snap = Call(c(), "POST", "/v1/sessions/" + a + "/snapshot");
  ASSERT_EQ(snap.status, 201) << snap.text;
  const std::string snapshot = snap.body.value("snapshot_id", "");
  ASSERT_FALSE(snapshot.empty()) << snap.text;
  Bash(c(), a, "echo v2 > state.txt");
  const std::string b = CreateSession(c(), ws_.path(), {{"from_snapshot", snapshot}, {"policy", kGvisorPolicy}});
  ASSERT_FALSE(b.empty());
  json r = Bash(c(), b, "cat state.txt; dmesg | head -1");
  EXPECT_TRUE(Contains(Output(r), "v1\n") && Contains(Output(r), "gVisor")) << r.dump();
}

TEST_F(GvisorSession, KillingTheDaemonLeavesNoSandbox) {
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(Output(Bash(c(), id, "echo up")), "up\n");
  const std::vector<pid_t> sandbox = d_.Descendants();
  ASSERT_GE(sandbox.size(), 3u) << "expected the world's supervisor, runsc and its sandbox";
  d_.Signal(SIGKILL);
  ASSERT_EQ(d_.WaitExit(10000), 128 + SIGKILL);
  EXPECT_TRUE(Daemon::WaitGone(sandbox, 15000)) << "runsc or its sandbox outlived the SIGKILLed daemon";
}

TEST_F(GvisorSession, WhatNeedsTheSandboxsDescriptorsIsRefusedNamingWhy) {
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(Output(Bash(c(), id, "echo up")), "up\n");
  Answer port = Call(c(), "POST", "/v1/sessions/" + id + "/ports", {{"port", 8090}});
  EXPECT_EQ(port.status, 400) << port.text;
  EXPECT_TRUE(Contains(port.message(), "gVisor sandbox with no network of its own")) << port.text;
  EXPECT_EQ(Output(Bash(c(), id, "echo still")), "still\n");
}

}  // namespace
}  // namespace agentbox::session_test
