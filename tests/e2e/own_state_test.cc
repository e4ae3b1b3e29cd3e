// agentbox's own state (the daemon's socket, session logs, upper layers,
// snapshots, caches) is absent from every sandbox, whatever the workspace
// and whatever the policy's deny list says. The home directory as the
// workspace, with a daemon in its default state directory, is the case
// that used to hand a sandbox the daemon.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "harness.h"

namespace agentbox::e2e {
namespace {

class OwnState : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(FindTool("curl").empty()) << "curl is missing (scripts/install-deps.sh installs it)";
    state_ = box_.home() + "/.local/state/agentbox";
    sock_ = state_ + "/agentbox.sock";
    daemon_ = std::make_unique<Process>(box_.AgentboxCommand({"serve"}));
    ASSERT_TRUE(daemon_->started()) << daemon_->start_error();
    for (int i = 0; i < 200 && !Exists(sock_); ++i) usleep(25000);
    ASSERT_TRUE(Exists(sock_)) << "the daemon did not create " << sock_;
    // Another session with a log, an upper layer and a snapshot.
    MakeDirs(box_.scratch() + "/other");
    other_ = Client({"create", "--workspace", box_.scratch() + "/other"});
    while (!other_.empty() && (other_.back() == '\n' || other_.back() == ' ')) other_.pop_back();
    ASSERT_FALSE(other_.empty());
    Client({"exec", other_, "--command", "echo " + secret_ + " > secret.txt"});
    Client({"snapshot", other_});
  }
  void TearDown() override {
    if (daemon_ && daemon_->started()) {
      kill(daemon_->pid(), SIGTERM);
      daemon_->Wait();
    }
  }
  std::string Client(std::vector<std::string> args, const std::string& stdin_data = "") {
    args.insert(args.begin(), "session");
    Command c = box_.AgentboxCommand(args);
    c.stdin_data = stdin_data;
    RunResult r = RunCommand(c);
    EXPECT_EQ(r.status, 0) << r.Describe();
    return r.out;
  }
  // What a command sees of the state directory, from inside.
  std::string Probe() const {
    return "ls -a " + state_ + " 2>&1; echo ls=$?\n"
           "cat " + state_ + "/sessions/*/log.jsonl 2>&1; echo logs=$?\n"
           "grep -r " + secret_ + " " + box_.home() + " 2>/dev/null; echo grep=$?\n"
           "curl -sS --unix-socket " + sock_ + " http://agentbox/v1/sessions 2>&1; echo \" curl=$?\"\n";
  }
  void ExpectHidden(const std::string& out) const {
    EXPECT_FALSE(Contains(out, secret_)) << out;
    EXPECT_FALSE(Contains(out, other_ + "\n")) << out;
    EXPECT_FALSE(Contains(out, "\"sessions\"")) << out;
    EXPECT_FALSE(Contains(out, "\"name\":\"bash\"")) << out;  // a line of a session log
    EXPECT_FALSE(Contains(out, "grep=0")) << out;
    EXPECT_TRUE(Contains(out, "logs=1")) << out;
    EXPECT_FALSE(Contains(out, " curl=0")) << out;
  }

  Sandbox box_;
  std::string state_, sock_, other_;
  const std::string secret_ = "sessionsecret" + RandomHex(6);
  std::unique_ptr<Process> daemon_;
};

TEST_F(OwnState, RunWithHomeAsWorkspaceSeesNoneOfIt) {
  RunResult r = box_.Sh(Probe(), {"--workspace", box_.home()});
  ExpectHidden(r.out);
  // The plan says why it is hidden.
  RunResult explain = RunCommand(box_.AgentboxCommand({"policy", "explain", "--workspace", box_.home()}));
  EXPECT_TRUE(Contains(explain.out, "agentbox's own state (always hidden)")) << explain.Describe();
}

TEST_F(OwnState, APolicyCannotLiftIt) {
  const std::string policy = box_.scratch() + "/p.yaml";
  WriteFile(policy, "version: 1\nfilesystem:\n  deny: []\n  read_only: [/usr, /bin, /lib, /lib64, /etc, ~/.local]\n");
  RunResult r = box_.Sh(Probe(), {"--policy", policy});
  ExpectHidden(r.out);
}

TEST_F(OwnState, LandlockOnlyRefusesAWorkspaceThatHoldsIt) {
  RunResult r = box_.Sh("echo ran", {"--workspace", box_.home(), "--backend", "landlock", "--require", "partial"});
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "ran"));
  EXPECT_TRUE(Contains(r.err, state_)) << r.Describe();
}

TEST_F(OwnState, SessionsOnHomeSeeNoneOfIt) {
  for (const char* policy : {"sandbox:\n  fresh_per_task: false\n", ""}) {
    const std::string file = box_.scratch() + "/session-policy.yaml";
    WriteFile(file, std::string("version: 1\n") + policy);
    std::string id = Client({"create", "--workspace", box_.home(), "--policy", file});
    while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
    ASSERT_FALSE(id.empty());
    Command c = box_.AgentboxCommand({"session", "exec", id, "--command", Probe()});
    RunResult r = RunCommand(c);
    SCOPED_TRACE(policy);
    ExpectHidden(r.out);
    // Nor through the file tools.
    Command read = box_.AgentboxCommand({"session", "read", id, ".local/state/agentbox/sessions/" + other_ + "/log.jsonl"});
    RunResult rr = RunCommand(read);
    EXPECT_NE(rr.status, 0) << rr.Describe();
    EXPECT_FALSE(Contains(rr.out, secret_)) << rr.Describe();
    Client({"rm", id});
  }
}

TEST_F(OwnState, NoSessionWorksOnTheStateItself) {
  Command c = box_.AgentboxCommand({"session", "create", "--workspace", state_ + "/sessions"});
  RunResult r = RunCommand(c);
  EXPECT_NE(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out + r.err, "agentbox's own state directory")) << r.Describe();
}

}  // namespace
}  // namespace agentbox::e2e
