// A call's own context (cwd, env, timeout), what execute refuses in its
// input, replays that do not match, the session policy's defaults (call and
// idle timeouts), and snapshots listed and deleted: through the daemon's API.
#include <gtest/gtest.h>

#include <csignal>
#include <chrono>
#include <functional>
#include <set>
#include <thread>

#include "daemon_fixture.h"

namespace agentbox::session_test {
namespace {

using e2e::Contains;
using e2e::TempDir;

class CallsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(d_.Start()) << d_.error(); }
  daemon::Client& c() { return d_.client(); }
  Answer Exec(const std::string& id, const std::string& name, const json& input, const std::string& call_id = "") {
    json body = {{"name", name}, {"input", input}};
    if (!call_id.empty()) body["call_id"] = call_id;
    return Call(c(), "POST", "/v1/sessions/" + id + "/execute", body);
  }
  // Waits (up to 30 s) for `pred` on the session's description.
  bool WaitDescribed(const std::string& id, const std::function<bool(const json&)>& pred) {
    for (int i = 0; i < 300; ++i) {
      Answer a = Call(c(), "GET", "/v1/sessions/" + id);
      if (a.status == 200 && pred(a.body)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  TempDir ws_{"agentbox-session-ws-"};  // outlives the daemon
  Daemon d_;
};

TEST_F(CallsTest, CwdIsResolvedInsideTheWorkspace) {
  const std::string id = CreateSession(c(), ws_.path());
  ASSERT_EQ(Bash(c(), id, "mkdir -p sub/deeper && ln -s sub/deeper inner").value("exit_code", -1), 0);
  Answer sub = Exec(id, "bash", {{"command", "pwd"}, {"cwd", "sub"}});
  ASSERT_EQ(sub.status, 200) << sub.text;
  EXPECT_TRUE(Contains(Output(sub.body), "/sub\n")) << sub.text;
  // A symlink that stays inside is followed, as `cd` follows it.
  Answer inner = Exec(id, "bash", {{"command", "pwd -P"}, {"cwd", "inner"}});
  ASSERT_EQ(inner.status, 200) << inner.text;
  EXPECT_TRUE(Contains(Output(inner.body), "/sub/deeper\n")) << inner.text;
  // The next call without cwd starts in the workspace again.
  EXPECT_EQ(Output(Bash(c(), id, "ls -d sub")), "sub\n");
}

TEST_F(CallsTest, CwdLeavingTheWorkspaceIsRefusedNamingThePath) {
  const std::string id = CreateSession(c(), ws_.path());
  ASSERT_EQ(Bash(c(), id, "ln -s / out && ln -s .. up && touch file").value("exit_code", -1), 0);
  for (const std::string cwd : {"..", "sub/../..", "/etc", "out", "out/tmp", "up", "missing", "file"}) {
    Answer a = Exec(id, "bash", {{"command", "touch /tmp/ran-" + std::to_string(cwd.size())}, {"cwd", cwd}}, "cwd-x");
    EXPECT_EQ(a.status, 400) << cwd << ": " << a.text;
    EXPECT_TRUE(Contains(a.message(), cwd)) << "the refusal does not name " << cwd << ": " << a.text;
  }
  // Nothing of the refused calls ran, and their call_id is free again.
  EXPECT_EQ(Output(Bash(c(), id, "ls /tmp | grep -c ran- || true")), "0\n");
  Answer fine = Exec(id, "bash", {{"command", "echo ok"}}, "cwd-x");
  ASSERT_EQ(fine.status, 200) << fine.text;
  EXPECT_EQ(fine.body.value("replayed", true), false) << fine.text;
}

TEST_F(CallsTest, EnvIsAddedAndTheSandboxsOwnVariablesAreRefused) {
  const std::string id = CreateSession(c(), ws_.path());
  Answer a = Exec(id, "bash", {{"command", "printf '%s|%s' \"$GREETING\" \"$EMPTY\""},
                               {"env", {{"GREETING", "hello world"}, {"EMPTY", ""}}}});
  ASSERT_EQ(a.status, 200) << a.text;
  EXPECT_EQ(Output(a.body), "hello world|") << a.text;
  // The variable is the call's: the next call does not have it.
  EXPECT_EQ(Output(Bash(c(), id, "echo \"[$GREETING]\"")), "[]\n");
  // A policy-set variable can be given another value for one call.
  EXPECT_EQ(Output(Exec(id, "bash", {{"command", "echo $HOME"}, {"env", {{"HOME", "/tmp"}}}}).body), "/tmp\n");

  for (const std::string bad : {"1ABC", "A-B", "A=B", ""}) {
    Answer r = Exec(id, "bash", {{"command", "true"}, {"env", {{bad, "x"}}}});
    EXPECT_EQ(r.status, 400) << "'" << bad << "': " << r.text;
    EXPECT_TRUE(Contains(r.message(), "input.env." + bad)) << r.text;
  }
  // The egress proxy's and the trust store's variables are agentbox's: an
  // override would send traffic past the proxy or trust another CA.
  for (const std::string own : {"HTTPS_PROXY", "http_proxy", "ALL_PROXY", "NO_PROXY", "SSL_CERT_FILE",
                                "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE"}) {
    Answer r = Exec(id, "bash", {{"command", "env"}, {"env", {{own, "http://127.0.0.1:1"}}}});
    EXPECT_EQ(r.status, 400) << own << ": " << r.text;
    EXPECT_TRUE(Contains(r.message(), own)) << r.text;
  }
  Answer not_string = Exec(id, "bash", {{"command", "true"}, {"env", {{"N", 1}}}});
  EXPECT_EQ(not_string.status, 400) << not_string.text;
  Answer nul = Exec(id, "bash", {{"command", "true"}, {"env", {{"N", std::string("a\0b", 3)}}}});
  EXPECT_EQ(nul.status, 400) << nul.text;
}

TEST_F(CallsTest, UnknownInputFieldsAreRefusedForEveryTool) {
  const std::string id = CreateSession(c(), ws_.path());
  const std::vector<std::pair<std::string, json>> calls = {
      {"bash", {{"command", "true"}}},       {"read_file", {{"path", "a"}}},
      {"write_file", {{"path", "a"}, {"content", ""}}}, {"edit_file", {{"path", "a"}, {"old", "x"}, {"new", "y"}}},
      {"list_dir", json::object()},          {"glob", {{"pattern", "*"}}}};
  for (auto [name, input] : calls) {
    input["cwdd"] = "x";
    Answer a = Exec(id, name, input);
    EXPECT_EQ(a.status, 400) << name << ": " << a.text;
    EXPECT_TRUE(Contains(a.message(), "input.cwdd")) << a.text;
  }
  // list_dir without a path lists the workspace.
  ASSERT_EQ(Exec(id, "write_file", {{"path", "here.txt"}, {"content", "x"}}).status, 200);
  Answer listed = Exec(id, "list_dir", json::object());
  ASSERT_EQ(listed.status, 200) << listed.text;
  EXPECT_TRUE(Contains(Output(listed.body), "here.txt")) << listed.text;
  // Values out of range are refused as before the call is run.
  EXPECT_EQ(Exec(id, "read_file", {{"path", "here.txt"}, {"offset", 0}}).status, 400);
  EXPECT_EQ(Exec(id, "bash", {{"command", ""}}).status, 400);
  EXPECT_EQ(Exec(id, "read_file", {{"path", "here.txt"}, {"limit", 2.0}}).status, 200);
}

TEST_F(CallsTest, AReplayMustBeTheSameRequest) {
  const std::string id = CreateSession(c(), ws_.path());
  Answer first = Exec(id, "bash", {{"command", "ls"}}, "c1");
  ASSERT_EQ(first.status, 200) << first.text;
  Answer same = Exec(id, "bash", {{"command", "ls"}}, "c1");
  ASSERT_EQ(same.status, 200) << same.text;
  EXPECT_EQ(same.body.value("replayed", false), true) << same.text;

  Answer other = Exec(id, "bash", {{"command", "pwd"}}, "c1");
  EXPECT_EQ(other.status, 409) << other.text;
  EXPECT_EQ(other.message(), "call_id c1 was recorded with input.command \"ls\", not \"pwd\"") << other.text;
  Answer more = Exec(id, "bash", {{"command", "ls"}, {"timeout", 5}}, "c1");
  EXPECT_EQ(more.status, 409) << more.text;
  EXPECT_TRUE(Contains(more.message(), "input.timeout")) << more.text;
  Answer tool = Exec(id, "list_dir", json::object(), "c1");
  EXPECT_EQ(tool.status, 409) << tool.text;
  EXPECT_TRUE(Contains(tool.message(), "for tool bash, not list_dir")) << tool.text;

  // Across a restart the log still knows what each call_id was.
  d_.Signal(SIGTERM);
  ASSERT_EQ(d_.WaitExit(30000), 0);
  ASSERT_TRUE(d_.Start()) << d_.error();
  EXPECT_EQ(Exec(id, "bash", {{"command", "pwd"}}, "c1").status, 409);
  EXPECT_EQ(Exec(id, "bash", {{"command", "ls"}}, "c1").body.value("replayed", false), true);
}

TEST_F(CallsTest, CallTimeoutComesFromTheSessionPolicyElseTheDefault) {
  const std::string plain = CreateSession(c(), ws_.path());
  json r = Bash(c(), plain, "true");
  EXPECT_EQ(r["outcome"]["usage"]["limits"].value("wall_clock_ms", 0), 600000) << r.dump();

  const std::string id = CreateSession(c(), ws_.path(), {{"policy", "version: 1\nsession:\n  call_timeout: 1s\n"}});
  json timed = Bash(c(), id, "echo before; sleep 30");
  EXPECT_EQ(timed.value("kind", ""), "timed_out") << timed.dump();
  EXPECT_TRUE(Contains(Output(timed), "before")) << timed.dump();
  EXPECT_EQ(timed["outcome"]["usage"]["limits"].value("wall_clock_ms", 0), 1000) << timed.dump();
  // The call's own timeout wins.
  Answer own = Exec(id, "bash", {{"command", "sleep 2; echo done"}, {"timeout", "20s"}});
  EXPECT_EQ(own.body.value("kind", ""), "exited") << own.text;
  EXPECT_EQ(Output(own.body), "done\n");
}

TEST_F(CallsTest, ASessionPolicyWithAMalformedValueIsRefusedNamingIt) {
  Answer shell = Call(c(), "POST", "/v1/sessions",
                      {{"workspace", ws_.path()}, {"policy", "version: 1\nsession:\n  shell: sticky\n"}});
  EXPECT_EQ(shell.status, 400) << shell.text;
  EXPECT_TRUE(Contains(shell.message(), "session.shell")) << shell.text;
  Answer bad = Call(c(), "POST", "/v1/sessions",
                    {{"workspace", ws_.path()}, {"policy", "version: 1\nsession:\n  call_timeout: 5\n"}});
  EXPECT_EQ(bad.status, 400) << bad.text;
  EXPECT_TRUE(Contains(bad.message(), "policy:3:17: session.call_timeout")) << bad.text;
}

TEST_F(CallsTest, AnIdleSessionsWorldStopsAndComesBackWithItsFiles) {
  const std::string id = CreateSession(c(), ws_.path(), {{"policy", "version: 1\nsession:\n  idle_timeout: 1s\n"}});
  ASSERT_EQ(Bash(c(), id, "echo kept > kept.txt").value("exit_code", -1), 0);
  const std::vector<pid_t> world = d_.Children();
  ASSERT_FALSE(world.empty());
  ASSERT_TRUE(WaitDescribed(id, [](const json& d) { return !d.value("provisioned", true); }))
      << "the idle session's world was not stopped";
  EXPECT_TRUE(Daemon::WaitGone(world, 15000)) << "the idle world's processes are still there";
  json again = Bash(c(), id, "cat kept.txt");
  EXPECT_EQ(Output(again), "kept\n") << again.dump();
  Answer d = Call(c(), "GET", "/v1/sessions/" + id);
  EXPECT_EQ(d.body.value("provisions", 0), 2) << d.text;
  auto log = c().Call("GET", "/v1/sessions/" + id + "/log");
  ASSERT_TRUE(log.ok());
  EXPECT_TRUE(Contains(log->body, "\"idle_stopped\"")) << log->body;
  EXPECT_TRUE(Contains(log->body, "was idle")) << log->body;
}

// With disk_gib the session's changes are on a tmpfs its world's init
// mounted: stopping an idle world keeps them (the daemon holds the layer).
TEST_F(CallsTest, AnIdleStopKeepsAnUpperLayerInMemory) {
  const std::string id = CreateSession(
      c(), ws_.path(), {{"policy", "version: 1\nresources:\n  disk_gib: 1\nsession:\n  idle_timeout: 1s\n"}});
  Answer d = Call(c(), "GET", "/v1/sessions/" + id);
  ASSERT_EQ(d.body.value("upper_fs", ""), "tmpfs") << d.text;
  json wrote = Bash(c(), id, "echo in-memory > mem.txt");
  ASSERT_EQ(wrote.value("exit_code", -1), 0) << wrote.dump();
  ASSERT_TRUE(WaitDescribed(id, [](const json& s) { return !s.value("provisioned", true); }));
  // While no world runs, the diff reads the layer the daemon holds.
  Answer diff = Call(c(), "GET", "/v1/sessions/" + id + "/diff");
  EXPECT_TRUE(Contains(diff.body.value("patch", ""), "+in-memory")) << diff.text;
  EXPECT_EQ(Output(Bash(c(), id, "cat mem.txt")), "in-memory\n");
}

TEST_F(CallsTest, ASessionWithACallInFlightIsNeverIdle) {
  const std::string id = CreateSession(c(), ws_.path(), {{"policy", "version: 1\nsession:\n  idle_timeout: 1s\n"}});
  // Longer than the idle timeout, several times over.
  json r = Bash(c(), id, "for i in 1 2 3 4; do sleep 1; echo $i; done");
  EXPECT_EQ(r.value("kind", ""), "exited") << r.dump();
  EXPECT_EQ(Output(r), "1\n2\n3\n4\n");
  Answer d = Call(c(), "GET", "/v1/sessions/" + id);
  EXPECT_EQ(d.body.value("provisions", 0), 1) << d.text;
}

TEST_F(CallsTest, SnapshotsAreListedDeletedAndGoWithTheirSession) {
  const std::string a = CreateSession(c(), ws_.path());
  ASSERT_EQ(Bash(c(), a, "echo one > one.txt").value("exit_code", -1), 0);
  Answer s1 = Call(c(), "POST", "/v1/sessions/" + a + "/snapshot");
  ASSERT_EQ(s1.status, 201) << s1.text;
  Answer s2 = Call(c(), "POST", "/v1/sessions/" + a + "/snapshot", {{"keep", true}});
  ASSERT_EQ(s2.status, 201) << s2.text;
  Answer s3 = Call(c(), "POST", "/v1/sessions/" + a + "/snapshot");
  ASSERT_EQ(s3.status, 201) << s3.text;
  const std::string id1 = s1.body["snapshot_id"], id2 = s2.body["snapshot_id"], id3 = s3.body["snapshot_id"];
  EXPECT_EQ(Call(c(), "POST", "/v1/sessions/" + a + "/snapshot", {{"kep", true}}).status, 400);

  Answer listed = Call(c(), "GET", "/v1/sessions/" + a + "/snapshots");
  ASSERT_EQ(listed.status, 200) << listed.text;
  ASSERT_EQ(listed.body["snapshots"].size(), 3u) << listed.text;
  EXPECT_EQ(listed.body["snapshots"][0].value("id", ""), id1);
  EXPECT_EQ(listed.body["snapshots"][0].value("session", ""), a);
  EXPECT_EQ(listed.body["snapshots"][0].value("keep", true), false);
  EXPECT_EQ(listed.body["snapshots"][1].value("keep", false), true);

  // A session started from s1 keeps it: deleting it is refused, naming the session.
  const std::string b = CreateSession(c(), ws_.path(), {{"from_snapshot", id1}});
  Answer refused = Call(c(), "DELETE", "/v1/snapshots/" + id1);
  EXPECT_EQ(refused.status, 409) << refused.text;
  EXPECT_TRUE(Contains(refused.message(), b)) << refused.text;
  Answer gone3 = Call(c(), "DELETE", "/v1/snapshots/" + id3);
  EXPECT_EQ(gone3.status, 204) << gone3.text;
  EXPECT_EQ(Call(c(), "DELETE", "/v1/snapshots/" + id3).status, 404);

  // Removing the session takes its snapshots but the kept one and the one b needs.
  ASSERT_EQ(Call(c(), "DELETE", "/v1/sessions/" + a).status, 204);
  Answer all = Call(c(), "GET", "/v1/snapshots");
  ASSERT_EQ(all.status, 200) << all.text;
  std::set<std::string> ids;
  for (const auto& s : all.body["snapshots"]) ids.insert(s.value("id", ""));
  EXPECT_EQ(ids, (std::set<std::string>{id1, id2})) << all.text;
  EXPECT_EQ(Output(Bash(c(), b, "cat one.txt")), "one\n") << "the session lost its snapshot's files";

  ASSERT_EQ(Call(c(), "DELETE", "/v1/sessions/" + b).status, 204);
  EXPECT_EQ(Call(c(), "DELETE", "/v1/snapshots/" + id1).status, 204);
  EXPECT_EQ(Call(c(), "GET", "/v1/sessions/" + a + "/snapshots").status, 404);
  EXPECT_EQ(Call(c(), "DELETE", "/v1/snapshots/bad.id").status, 400);
}

TEST_F(CallsTest, ASnapshotsParentCannotBeDeleted) {
  const std::string a = CreateSession(c(), ws_.path());
  ASSERT_EQ(Bash(c(), a, "echo one > one.txt").value("exit_code", -1), 0);
  const std::string parent = Call(c(), "POST", "/v1/sessions/" + a + "/snapshot").body.value("snapshot_id", "");
  const std::string b = CreateSession(c(), ws_.path(), {{"from_snapshot", parent}});
  ASSERT_EQ(Bash(c(), b, "echo two > two.txt").value("exit_code", -1), 0);
  const std::string child =
      Call(c(), "POST", "/v1/sessions/" + b + "/snapshot", {{"keep", true}}).body.value("snapshot_id", "");
  ASSERT_EQ(Call(c(), "DELETE", "/v1/sessions/" + b).status, 204);
  Answer refused = Call(c(), "DELETE", "/v1/snapshots/" + parent);
  EXPECT_EQ(refused.status, 409) << refused.text;
  EXPECT_TRUE(Contains(refused.message(), child)) << refused.text;
  const std::string c2 = CreateSession(c(), ws_.path(), {{"from_snapshot", child}});
  EXPECT_EQ(Output(Bash(c(), c2, "cat one.txt two.txt")), "one\ntwo\n");
}

}  // namespace
}  // namespace agentbox::session_test
