// `agentbox session ...` against a real daemon, the way a shell user works.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "daemon_fixture.h"

namespace agentbox::session_test {
namespace {

using e2e::Contains;
using e2e::TempDir;

class SessionCliTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(d_.Start()) << d_.error(); }

  // agentbox session --socket S ARGS..., in the workspace.
  e2e::RunResult Cli(const std::vector<std::string>& args, const std::string& stdin_data = "") {
    e2e::Command c;
    c.argv = {e2e::AgentboxBin(), "session", "--socket", d_.socket()};
    c.argv.insert(c.argv.end(), args.begin(), args.end());
    c.env = d_.Env();
    c.cwd = ws_.path();
    c.stdin_data = stdin_data;
    c.timeout_ms = 120000;
    return e2e::RunCommand(c);
  }
  std::string Create() {
    e2e::RunResult r = Cli({"create", "--workspace", ws_.path()});
    EXPECT_EQ(r.status, 0) << r.Describe();
    std::string id = r.out;
    while (!id.empty() && id.back() == '\n') id.pop_back();
    EXPECT_FALSE(id.empty());
    return id;
  }

  TempDir ws_{"agentbox-session-ws-"};  // outlives the daemon
  Daemon d_;
};

TEST_F(SessionCliTest, ExecPrintsOutputAndExitsWithTheCommandsStatus) {
  const std::string id = Create();
  e2e::RunResult ok = Cli({"exec", id, "--", "echo", "hello world"});
  EXPECT_EQ(ok.status, 0) << ok.Describe();
  EXPECT_EQ(ok.out, "hello world\n");

  e2e::RunResult three = Cli({"exec", id, "--", "sh", "-c", "echo to-stderr >&2; exit 3"});
  EXPECT_EQ(three.status, 3) << three.Describe();
  EXPECT_EQ(three.out, "to-stderr\n") << "the command's output only, on stdout: " << three.Describe();
  EXPECT_TRUE(Contains(three.err, "[exit code 3]")) << three.Describe();

  e2e::RunResult killed = Cli({"exec", id, "--", "sh", "-c", "kill -TERM $$"});
  EXPECT_EQ(killed.status, 128 + 15) << killed.Describe();

  e2e::RunResult quoted = Cli({"exec", id, "--", "printf", "%s|", "a b", "it's", "$HOME"});
  EXPECT_EQ(quoted.out, "a b|it's|$HOME|") << quoted.Describe();

  e2e::RunResult command = Cli({"exec", id, "--command", "x=4; echo $((x * 2)) | tr 8 9"});
  EXPECT_EQ(command.out, "9\n") << command.Describe();

  e2e::RunResult as_json = Cli({"exec", id, "--json", "--call-id", "cli-1", "--", "sh", "-c", "exit 5"});
  EXPECT_EQ(as_json.status, 5) << as_json.Describe();
  json result = json::parse(as_json.out, nullptr, false);
  ASSERT_TRUE(result.is_object()) << as_json.out;
  EXPECT_EQ(result.value("kind", ""), "exited");
  EXPECT_EQ(result.value("exit_code", 0), 5);
  EXPECT_EQ(result.value("call_id", ""), "cli-1");

  e2e::RunResult streamed = Cli({"exec", id, "--stream", "--", "sh", "-c", "echo one; echo two"});
  EXPECT_EQ(streamed.status, 0) << streamed.Describe();
  EXPECT_EQ(streamed.out, "one\ntwo\n");

  e2e::RunResult fed = Cli({"exec", id, "--stdin", "--", "tr", "a-z", "A-Z"}, "shout\n");
  EXPECT_EQ(fed.out, "SHOUT\n") << fed.Describe();

  e2e::RunResult usage = Cli({"exec", id});
  EXPECT_EQ(usage.status, 2) << usage.Describe();
}

TEST_F(SessionCliTest, TimeoutExitsWith124) {
  const std::string id = Create();
  e2e::RunResult r = Cli({"exec", id, "--timeout", "1s", "--", "sh", "-c", "echo partial; sleep 60"});
  EXPECT_EQ(r.status, 124) << r.Describe();
  EXPECT_EQ(r.out, "partial\n") << r.Describe();
  EXPECT_TRUE(Contains(r.err, "timed_out")) << r.Describe();
  e2e::RunResult streamed = Cli({"exec", id, "--stream", "--timeout", "1s", "--", "sh", "-c", "echo partial; sleep 60"});
  EXPECT_EQ(streamed.status, 124) << streamed.Describe();
  EXPECT_EQ(streamed.out, "partial\n") << streamed.Describe();
}

TEST_F(SessionCliTest, ProtectedPathIsASandboxDenial) {
  MakeRepo(ws_.path(), {{"README", "x\n"}});
  const std::string id = Create();
  e2e::RunResult r = Cli({"exec", id, "--", "sh", "-c", "echo evil >> .git/config"});
  EXPECT_NE(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "sandbox_denied")) << r.Describe();
  e2e::RunResult replay = Cli({"exec", id, "--call-id", "once", "--", "sh", "-c", "echo once; exit 4"});
  EXPECT_EQ(replay.status, 4);
  e2e::RunResult again = Cli({"exec", id, "--stream", "--call-id", "once", "--", "sh", "-c", "echo once; exit 4"});
  EXPECT_EQ(again.status, 4) << "a replay exits as the recorded call did: " << again.Describe();
  EXPECT_EQ(again.out, "once\n") << again.Describe();
  // Another command under that call_id is refused, not replayed.
  e2e::RunResult other = Cli({"exec", id, "--call-id", "once", "--", "sh", "-c", "echo twice"});
  EXPECT_EQ(other.status, 125) << other.Describe();
  EXPECT_TRUE(Contains(other.err, "call_id once was recorded with input.command")) << other.Describe();
  EXPECT_EQ(other.out, "") << other.Describe();
}

TEST_F(SessionCliTest, ExecTakesCwdAndEnvAndSnapshotsAreListedAndRemoved) {
  const std::string id = Create();
  ASSERT_EQ(Cli({"exec", id, "--", "mkdir", "-p", "sub/dir"}).status, 0);
  e2e::RunResult r = Cli({"exec", id, "--cwd", "sub", "--env", "A=one", "--env", "B=two=2", "--", "sh", "-c",
                          "echo \"$A $B\"; pwd"});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "one two=2\n")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "/sub\n")) << r.Describe();
  e2e::RunResult outside = Cli({"exec", id, "--cwd", "..", "--", "true"});
  EXPECT_EQ(outside.status, 125) << outside.Describe();
  EXPECT_TRUE(Contains(outside.err, "outside the workspace")) << outside.Describe();
  e2e::RunResult bad_env = Cli({"exec", id, "--env", "NOEQUALS", "--", "true"});
  EXPECT_NE(bad_env.status, 0) << bad_env.Describe();
  EXPECT_TRUE(Contains(bad_env.err, "NOEQUALS")) << bad_env.Describe();

  e2e::RunResult snap = Cli({"snapshot", id, "--keep"});
  ASSERT_EQ(snap.status, 0) << snap.Describe();
  std::string snap_id = snap.out;
  while (!snap_id.empty() && snap_id.back() == '\n') snap_id.pop_back();
  e2e::RunResult listed = Cli({"snapshots", id});
  EXPECT_EQ(listed.status, 0) << listed.Describe();
  EXPECT_TRUE(Contains(listed.out, snap_id + "\t" + id)) << listed.Describe();
  EXPECT_TRUE(Contains(listed.out, "kept")) << listed.Describe();
  EXPECT_EQ(Cli({"snapshot-rm", snap_id}).status, 0);
  e2e::RunResult none = Cli({"snapshots", "--json"});
  EXPECT_EQ(none.status, 0) << none.Describe();
  EXPECT_FALSE(Contains(none.out, snap_id)) << none.Describe();
  EXPECT_NE(Cli({"snapshot-rm", snap_id}).status, 0);
}

// A session never writes into its base: the placeholder that keeps a
// missing `.git` from being created lives in the session's own layer.
TEST_F(SessionCliTest, AWorkspaceWithoutGitGetsNoPlaceholderOnTheHost) {
  auto entries = [&] {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(ws_.path())) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  };
  e2e::WriteFile(ws_ / "README", "x\n");
  const std::vector<std::string> before = entries();
  const std::string id = Create();
  EXPECT_EQ(entries(), before);
  e2e::RunResult r = Cli({"exec", id, "--", "sh", "-c",
                          "ls -A; mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit; echo \"plant=$?\"; exit 0"});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "plant=")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "plant=0")) << "a .git was created inside the session\n" << r.Describe();
  EXPECT_EQ(entries(), before) << "the session wrote into its base while it lives";
  e2e::RunResult again = Cli({"exec", id, "--", "sh", "-c", "git init -q . ; echo \"init=$?\"; exit 0"});
  EXPECT_FALSE(Contains(again.out, "init=0")) << again.Describe();
  EXPECT_EQ(entries(), before) << "the session wrote into its base while it lives";
  e2e::RunResult diff = Cli({"diff", id});
  EXPECT_EQ(diff.status, 0) << diff.Describe();
  EXPECT_FALSE(Contains(diff.out, ".git")) << "the placeholder is no change of the session's\n" << diff.Describe();
}

TEST_F(SessionCliTest, WriteThenReadAndTheShellAgrees) {
  const std::string id = Create();
  e2e::RunResult w = Cli({"write", id, "hello.txt"}, "from stdin\nline two\n");
  EXPECT_EQ(w.status, 0) << w.Describe();
  e2e::RunResult r = Cli({"read", id, "hello.txt"});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "from stdin")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "line two")) << r.Describe();
  EXPECT_EQ(Cli({"exec", id, "--", "cat", "hello.txt"}).out, "from stdin\nline two\n");
  e2e::RunResult missing = Cli({"read", id, "no/such/file"});
  EXPECT_NE(missing.status, 0) << missing.Describe();
  EXPECT_TRUE(Contains(missing.err, "no/such/file")) << missing.Describe();
  EXPECT_FALSE(e2e::Exists(ws_ / "hello.txt"));
}

TEST_F(SessionCliTest, DiffPipesIntoGitApply) {
  MakeRepo(ws_.path(), {{"app.py", "print('v1')\n"}, {"old.txt", "old\n"}});
  const std::string id = Create();
  ASSERT_EQ(Cli({"exec", id, "--command", "sed -i s/v1/v2/ app.py && rm old.txt && echo new > new.txt"}).status, 0);
  TempDir parent("agentbox-session-clone-");
  const std::string clone = parent / "clone";
  ASSERT_EQ(Git({"clone", "-q", ws_.path(), clone}, parent.path()).status, 0);

  e2e::Command pipe;
  pipe.argv = {"/bin/sh", "-c",
               "set -e; \"$0\" session --socket \"$1\" diff \"$2\" | git -C \"$3\" apply --index -",
               e2e::AgentboxBin(), d_.socket(), id, clone};
  pipe.env = d_.Env();
  pipe.env.push_back("GIT_CONFIG_NOSYSTEM=1");
  e2e::RunResult applied = e2e::RunCommand(pipe);
  ASSERT_EQ(applied.status, 0) << applied.Describe();
  EXPECT_EQ(e2e::ReadFile(clone + "/app.py").value_or(""), "print('v2')\n");
  EXPECT_EQ(e2e::ReadFile(clone + "/new.txt").value_or(""), "new\n");
  EXPECT_FALSE(e2e::Exists(clone + "/old.txt"));
  EXPECT_EQ(e2e::ReadFile(ws_ / "app.py").value_or(""), "print('v1')\n") << "the base changed";

  e2e::RunResult as_json = Cli({"diff", id, "--json"});
  json diff = json::parse(as_json.out, nullptr, false);
  ASSERT_TRUE(diff.is_object()) << as_json.Describe();
  EXPECT_EQ(diff["files"].size(), 3u) << as_json.out;
}

TEST_F(SessionCliTest, SnapshotLogLsAndRm) {
  const std::string id = Create();
  ASSERT_EQ(Cli({"exec", id, "--call-id", "mark", "--", "sh", "-c", "echo snap > s.txt"}).status, 0);
  e2e::RunResult snap = Cli({"snapshot", id});
  ASSERT_EQ(snap.status, 0) << snap.Describe();
  std::string snapshot = snap.out.substr(0, snap.out.find('\n'));
  ASSERT_FALSE(snapshot.empty());
  e2e::RunResult fork = Cli({"create", "--workspace", ws_.path(), "--from-snapshot", snapshot});
  ASSERT_EQ(fork.status, 0) << fork.Describe();
  std::string forked = fork.out.substr(0, fork.out.find('\n'));
  EXPECT_EQ(Cli({"exec", forked, "--", "cat", "s.txt"}).out, "snap\n");

  e2e::RunResult log = Cli({"log", id});
  EXPECT_EQ(log.status, 0) << log.Describe();
  EXPECT_TRUE(Contains(log.out, "\"mark\"")) << log.out;
  for (const auto& line : e2e::Lines(log.out)) {
    EXPECT_FALSE(json::parse(line, nullptr, false).is_discarded()) << "not JSON: " << line;
  }

  e2e::RunResult ls = Cli({"ls"});
  EXPECT_EQ(ls.status, 0);
  EXPECT_TRUE(Contains(ls.out, id)) << ls.out;
  EXPECT_TRUE(Contains(ls.out, forked)) << ls.out;

  EXPECT_EQ(Cli({"rm", id}).status, 0);
  e2e::RunResult gone = Cli({"exec", id, "--", "true"});
  EXPECT_EQ(gone.status, 125) << gone.Describe();
  EXPECT_TRUE(Contains(gone.err, id)) << gone.Describe();
  EXPECT_FALSE(Contains(Cli({"ls"}).out, id));
}

TEST_F(SessionCliTest, NoDaemonIsAClearError) {
  e2e::Command c;
  c.argv = {e2e::AgentboxBin(), "session", "--socket", ws_ / "nothing.sock", "exec", "x", "--", "true"};
  c.env = d_.Env();
  e2e::RunResult r = e2e::RunCommand(c);
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "nothing.sock")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "start one with `agentbox serve`")) << r.Describe();  // and how to get one
}

TEST_F(SessionCliTest, EnvironmentVariableFindsTheSocket) {
  e2e::Command c;
  c.argv = {e2e::AgentboxBin(), "session", "create", "--workspace", ws_.path()};
  c.env = d_.Env();
  c.env.push_back("AGENTBOX_SOCKET=" + d_.socket());
  e2e::RunResult r = e2e::RunCommand(c);
  ASSERT_EQ(r.status, 0) << r.Describe();
  std::string id = r.out.substr(0, r.out.find('\n'));
  ASSERT_FALSE(id.empty()) << r.Describe();
  // The session exists at the daemon behind that socket: it runs commands
  // there, and that daemon lists it.
  EXPECT_TRUE(Contains(Cli({"ls"}).out, id));
  e2e::RunResult ran = Cli({"exec", id, "--", "echo", "via-env"});
  EXPECT_EQ(ran.status, 0) << ran.Describe();
  EXPECT_EQ(ran.out, "via-env\n");
  // Without the variable (and without --socket) the same command finds no daemon there.
  c.env.pop_back();
  c.env.push_back("AGENTBOX_SOCKET=" + (ws_ / "nothing.sock"));
  e2e::RunResult elsewhere = e2e::RunCommand(c);
  EXPECT_NE(elsewhere.status, 0) << elsewhere.Describe();
  EXPECT_TRUE(Contains(elsewhere.err, "nothing.sock")) << elsewhere.Describe();
}

TEST_F(SessionCliTest, TcpWithTokenFile) {
  TempDir secrets("agentbox-session-token-");
  const std::string token = secrets / "token";
  e2e::WriteFile(token, "abcdefabcdefabcdefabcdef\n", 0600);
  Daemon tcp;
  ASSERT_TRUE(tcp.Start({"--listen", "127.0.0.1:0", "--token-file", token})) << tcp.error();
  json e = tcp.LogEvent("listening");
  const std::string url = "http://" + e.value("address", "");
  e2e::Command c;
  c.argv = {e2e::AgentboxBin(), "session", "--url", url, "--token-file", token, "create", "--workspace", ws_.path()};
  c.env = d_.Env();
  e2e::RunResult r = e2e::RunCommand(c);
  EXPECT_EQ(r.status, 0) << r.Describe();
  c.argv = {e2e::AgentboxBin(), "session", "--url", url, "ls"};
  r = e2e::RunCommand(c);
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(Contains(r.err, "--token-file")) << r.Describe();
}

}  // namespace
}  // namespace agentbox::session_test
