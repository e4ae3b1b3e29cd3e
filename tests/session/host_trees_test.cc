// Sessions see what a policy adds beyond the workspace as `agentbox run`
// does (the same plan): a cache shared with runs and other sessions of the
// user, and dotfiles imported from the real home.
#include <gtest/gtest.h>

#include <string>

#include "daemon_fixture.h"

namespace agentbox::session_test {
namespace {

using e2e::Contains;
using e2e::TempDir;

std::string HomeOf(const std::vector<std::string>& env) {
  for (const auto& e : env) {
    if (e.rfind("HOME=", 0) == 0) return e.substr(5);
  }
  return "";
}

TEST(SessionHostTrees, CacheIsSharedWithRunsAndOtherSessions) {
  TempDir ws("agentbox-session-ws-");
  Daemon d;
  ASSERT_TRUE(d.Start()) << d.error();
  const std::string home = HomeOf(d.Env());
  ASSERT_FALSE(home.empty());
  const std::string policy = "version: 1\nfilesystem:\n  caches: {npm: ~/.npm}\n";
  const std::string marker = "cached-" + e2e::RandomHex();

  // A run of the same user fills the cache; the session reads and adds.
  TempDir scratch("agentbox-session-scratch-");
  const std::string policy_file = scratch.path() + "/policy.yaml";
  e2e::WriteFile(policy_file, policy);
  e2e::Command run;
  run.argv = {e2e::AgentboxBin(), "run", "--policy", policy_file, "--", "sh", "-c", "echo " + marker + " > ~/.npm/m"};
  run.env = d.Env();
  run.cwd = ws.path();
  e2e::RunResult filled = e2e::RunCommand(run);
  ASSERT_EQ(filled.status, 0) << filled.Describe();

  const std::string a = CreateSession(d.client(), ws.path(), {{"policy", policy}});
  json read = Bash(d.client(), a, "cat ~/.npm/m && echo from-a > ~/.npm/a");
  EXPECT_EQ(read.value("exit_code", -1), 0) << read.dump();
  EXPECT_TRUE(Contains(read.value("output", ""), marker)) << read.dump();

  const std::string b = CreateSession(d.client(), ws.path(), {{"policy", policy}});
  json other = Bash(d.client(), b, "cat ~/.npm/a");
  EXPECT_EQ(other.value("exit_code", -1), 0) << other.dump();
  EXPECT_TRUE(Contains(other.value("output", ""), "from-a")) << other.dump();

  EXPECT_EQ(e2e::ReadFile(home + "/.cache/agentbox/caches/npm/a").value_or(""), "from-a\n");
  EXPECT_FALSE(e2e::Exists(home + "/.npm")) << "the user's real ~/.npm was created";
}

TEST(SessionHostTrees, ImportedGitconfigGivesGitItsIdentity) {
  TempDir ws("agentbox-session-ws-");
  Daemon d;
  ASSERT_TRUE(d.Start()) << d.error();
  const std::string home = HomeOf(d.Env());
  const std::string gitconfig = "[user]\n\tname = Session User\n\temail = s@example.com\n";
  e2e::WriteFile(home + "/.gitconfig", gitconfig);
  MakeRepo(ws.path(), {{"README", "hi\n"}});
  const std::string id =
      CreateSession(d.client(), ws.path(), {{"policy", "version: 1\nhome:\n  import: [.gitconfig]\n"}});
  json r = Bash(d.client(), id,
                "git commit -q --allow-empty -m inside && git log -1 --format=%an; "
                "echo x >> ~/.gitconfig; echo append=$?");
  EXPECT_TRUE(Contains(r.value("output", ""), "Session User")) << r.dump();
  EXPECT_FALSE(Contains(r.value("output", ""), "append=0")) << r.dump();
  EXPECT_EQ(e2e::ReadFile(home + "/.gitconfig").value_or(""), gitconfig);
}

// A session's commands sit in a signal-scoping Landlock layer of their
// own: links and renames across directories still work (the layer would
// deny them, EXDEV, without its rule), and only where the world allows.
TEST(SessionHostTrees, LinksAcrossDirectoriesWork) {
  TempDir ws("agentbox-session-ws-");
  Daemon d;
  ASSERT_TRUE(d.Start()) << d.error();
  const std::string id = CreateSession(d.client(), ws.path(), {});
  json r = Bash(d.client(), id, "mkdir -p a b && echo x > a/f && ln a/f b/g; echo ln=$?; ln a/f /usr/g; echo usr=$?");
  EXPECT_TRUE(Contains(r.value("output", ""), "ln=0")) << r.dump();
  EXPECT_FALSE(Contains(r.value("output", ""), "usr=0")) << r.dump();
}

}  // namespace
}  // namespace agentbox::session_test
