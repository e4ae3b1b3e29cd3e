// Sessions through the daemon's API: lazy start, warm calls, one execution
// world for file tools and the shell, isolation, diff, snapshots, replay.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "daemon_fixture.h"
#include "policy/sha256.h"

namespace agentbox::session_test {
namespace {

using e2e::Contains;
using e2e::TempDir;

class SessionsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(d_.Start()) << d_.error(); }
  daemon::Client& c() { return d_.client(); }

  TempDir ws_{"agentbox-session-ws-"};  // outlives the daemon
  Daemon d_;
};

TEST_F(SessionsTest, CreateStartsNothingUntilTheFirstCall) {
  std::string id = CreateSession(c(), ws_.path());
  ASSERT_FALSE(id.empty());
  EXPECT_TRUE(d_.Children().empty()) << "a process exists right after create";
  Answer described = Call(c(), "GET", "/v1/sessions/" + id);
  ASSERT_EQ(described.status, 200) << described.text;
  EXPECT_EQ(described.body.value("provisioned", true), false) << described.text;
  EXPECT_TRUE(d_.Children().empty()) << "describing a session started something";

  json r = Bash(c(), id, "echo hello");
  EXPECT_EQ(r.value("kind", ""), "exited") << r.dump();
  EXPECT_EQ(Output(r), "hello\n");
  EXPECT_FALSE(d_.Children().empty()) << "no sandbox process after the first call";
  described = Call(c(), "GET", "/v1/sessions/" + id);
  EXPECT_EQ(described.body.value("provisioned", false), true) << described.text;
}

TEST_F(SessionsTest, WarmCallsReuseTheSameSandbox) {
  std::string id = CreateSession(c(), ws_.path());
  json first = Bash(c(), id, "echo 1 > /tmp/warm && cat /tmp/warm");
  ASSERT_EQ(Output(first), "1\n") << first.dump();
  const std::vector<pid_t> after_first = d_.Children();
  ASSERT_FALSE(after_first.empty());
  for (int i = 0; i < 5; ++i) {
    json r = Bash(c(), id, "cat /tmp/warm");
    EXPECT_EQ(Output(r), "1\n") << "the world's /tmp is gone: a new sandbox per call? " << r.dump();
  }
  EXPECT_EQ(d_.Children(), after_first) << "the daemon's sandbox processes changed between warm calls";
}

// A write_file larger than a control message travels in a memfd, its
// content after the request's JSON line: every byte of it lands, whatever
// it holds (leading newlines, lines that look like JSON, multi-byte UTF-8),
// and a content of a few bytes after it takes the inline path again.
TEST_F(SessionsTest, ALargeWriteFileLandsByteForByte) {
  std::string id = CreateSession(c(), ws_.path());
  std::string big = "\n\n{\"op\":\"exec\",\"argv\":[\"false\"]}\n";
  for (int i = 0; big.size() < (1u << 20) + 17; ++i) {
    big += "line " + std::to_string(i) + " \xc3\xa9t\xc3\xa9 \xe2\x82\xac " + std::string(i % 50, '.') + "\n";
  }
  json w = Execute(c(), id, "write_file", {{"path", "big.txt"}, {"content", big}});
  ASSERT_EQ(w.value("is_error", true), false) << w.dump().substr(0, 400);
  EXPECT_EQ(Output(Bash(c(), id, "wc -c < big.txt")), std::to_string(big.size()) + "\n");
  EXPECT_EQ(Output(Bash(c(), id, "sha256sum big.txt | cut -c1-64")), agentbox::Sha256Hex(big) + "\n")
      << "the file differs from what was written";
  json small = Execute(c(), id, "write_file", {{"path", "big.txt"}, {"content", "\n"}});
  ASSERT_EQ(small.value("is_error", true), false) << small.dump();
  EXPECT_EQ(Output(Bash(c(), id, "od -An -c big.txt | tr -d ' '")), "\\n\n");
}

// A read as large as the cap comes back whole, byte for byte: its answer
// fills the tool's pipe (sized for 1 MiB, World::File) and more.
TEST_F(SessionsTest, AReadFileAsLargeAsTheCapComesBackByteForByte) {
  std::string id = CreateSession(c(), ws_.path());
  std::string text;
  for (int i = 0; text.size() < (1u << 20) - 200; ++i) {
    text += "line " + std::to_string(i) + " \xc3\xa9t\xc3\xa9 \xe2\x82\xac \"q\" \\ " + std::string(i % 40, '.') + "\n";
  }
  json w = Execute(c(), id, "write_file", {{"path", "whole.txt"}, {"content", text}});
  ASSERT_EQ(w.value("is_error", true), false) << w.dump().substr(0, 400);
  json r = Execute(c(), id, "read_file", {{"path", "whole.txt"}});
  ASSERT_EQ(r.value("is_error", true), false) << r.dump().substr(0, 400);
  const std::string got = Output(r);
  EXPECT_EQ(got.size(), text.size());
  EXPECT_TRUE(got == text) << "the read differs from the file";
  // Past the cap: the lines that fit, whole, then the note.
  json more = Execute(c(), id, "write_file", {{"path", "more.txt"}, {"content", text + text}});
  ASSERT_EQ(more.value("is_error", true), false);
  json cut = Execute(c(), id, "read_file", {{"path", "more.txt"}});
  const std::string head = Output(cut);
  const std::size_t note = head.find("[truncated: ");
  ASSERT_NE(note, std::string::npos) << head.substr(head.size() > 300 ? head.size() - 300 : 0);
  EXPECT_EQ(head.substr(0, note), (text + text).substr(0, note));
  EXPECT_EQ(head[note - 1], '\n');
}

TEST_F(SessionsTest, FileToolsAndShellSeeTheSameFiles) {
  std::string id = CreateSession(c(), ws_.path());
  ASSERT_EQ(Bash(c(), id, "mkdir notes").value("exit_code", -1), 0);
  json w = Execute(c(), id, "write_file", {{"path", "notes/from-tool.txt"}, {"content", "written by the tool\n"}});
  ASSERT_EQ(w.value("is_error", true), false) << w.dump();
  json cat = Bash(c(), id, "cat notes/from-tool.txt");
  EXPECT_EQ(Output(cat), "written by the tool\n") << cat.dump();

  json sh = Bash(c(), id, "printf 'written by the shell\\n' > from-shell.txt");
  ASSERT_EQ(sh.value("exit_code", -1), 0) << sh.dump();
  json read = Execute(c(), id, "read_file", {{"path", "from-shell.txt"}});
  EXPECT_EQ(read.value("is_error", true), false) << read.dump();
  EXPECT_TRUE(Contains(Output(read), "written by the shell")) << read.dump();

  json edit = Execute(c(), id, "edit_file", {{"path", "from-shell.txt"}, {"old", "shell"}, {"new", "editor"}});
  EXPECT_EQ(edit.value("is_error", true), false) << edit.dump();
  EXPECT_EQ(Output(Bash(c(), id, "cat from-shell.txt")), "written by the editor\n");

  json list = Execute(c(), id, "list_dir", {{"path", "."}});
  EXPECT_TRUE(Contains(Output(list), "from-shell.txt")) << list.dump();
  EXPECT_TRUE(Contains(Output(list), "notes")) << list.dump();
  json glob = Execute(c(), id, "glob", {{"pattern", "**/*.txt"}});
  EXPECT_TRUE(Contains(Output(glob), "notes/from-tool.txt")) << glob.dump();

  // The base workspace is untouched.
  EXPECT_FALSE(e2e::Exists(ws_ / "from-shell.txt"));
  EXPECT_FALSE(e2e::Exists(ws_ / "notes"));
}

TEST_F(SessionsTest, ProtectedPathsAreDeniedToFileToolsAsToTheShell) {
  MakeRepo(ws_.path(), {{"README", "base\n"}});
  const std::string config_before = e2e::ReadFile(ws_ / ".git/config").value_or("");
  std::string id = CreateSession(c(), ws_.path());

  json tool = Execute(c(), id, "write_file", {{"path", ".git/config"}, {"content", "[core]\n\thooksPath = /tmp/evil\n"}});
  EXPECT_EQ(tool.value("kind", ""), "sandbox_denied") << tool.dump();
  EXPECT_EQ(tool.value("is_error", false), true);
  json shell = Bash(c(), id, "echo '[core] hooksPath = /tmp/evil' >> .git/config");
  EXPECT_EQ(shell.value("kind", ""), "sandbox_denied") << shell.dump();

  json edit = Execute(c(), id, "edit_file", {{"path", ".git/config"}, {"old", "[core]"}, {"new", "[x]"}});
  EXPECT_EQ(edit.value("kind", ""), "sandbox_denied") << edit.dump();

  EXPECT_EQ(Output(Bash(c(), id, "cat .git/config")), config_before) << "the session's view of .git/config changed";
  EXPECT_EQ(e2e::ReadFile(ws_ / ".git/config").value_or(""), config_before);
}

// on_violation.escalation: one_time_approval: a bash call's denial carries
// the offer of the grant that would have allowed it; with the default
// (deny), none. A write creating /usr/... is offered /usr, its nearest
// existing parent.
TEST_F(SessionsTest, BashDenialsCarryTheirEscalationOffer) {
  const std::string policy =
      "version: 1\non_violation:\n  escalation: one_time_approval\n  max_grant:\n    filesystem_write: [/usr]\n";
  std::string id = CreateSession(c(), ws_.path(), {{"policy", policy}});
  ASSERT_FALSE(id.empty());
  json r = Bash(c(), id, "echo x > /usr/agentbox-escalation-probe");
  EXPECT_EQ(r.value("kind", ""), "sandbox_denied") << r.dump();
  ASSERT_TRUE(r["outcome"]["denials"].is_array()) << r.dump();
  const json* offered = nullptr;
  for (const auto& d : r["outcome"]["denials"]) {
    if (d.value("target", "") == "/usr/agentbox-escalation-probe") offered = &d;
  }
  ASSERT_NE(offered, nullptr) << r.dump();
  ASSERT_TRUE(offered->contains("escalation")) << r.dump();
  const json& e = (*offered)["escalation"];
  EXPECT_EQ(e["grant"], json({{"filesystem.read_write", "/usr"}})) << r.dump();
  EXPECT_EQ(e["within_ceiling"], true) << r.dump();
  EXPECT_EQ(e.value("id", "").rfind("esc-", 0), 0u) << r.dump();
  // Listed, not granted: the file is not there.
  EXPECT_EQ(Output(Bash(c(), id, "test -e /usr/agentbox-escalation-probe && echo there || echo absent")), "absent\n");

  std::string plain = CreateSession(c(), ws_.path());
  json denied = Bash(c(), plain, "echo x > /usr/agentbox-escalation-probe");
  EXPECT_EQ(denied.value("kind", ""), "sandbox_denied") << denied.dump();
  ASSERT_FALSE(denied["outcome"]["denials"].empty()) << denied.dump();
  for (const auto& d : denied["outcome"]["denials"]) EXPECT_FALSE(d.contains("escalation")) << denied.dump();
}

TEST_F(SessionsTest, TwoSessionsOnOneBaseAreIsolated) {
  e2e::WriteFile(ws_ / "shared.txt", "base\n");
  std::string a = CreateSession(c(), ws_.path());
  std::string b = CreateSession(c(), ws_.path());
  ASSERT_NE(a, b);
  Bash(c(), a, "echo A > shared.txt && echo A > only-a.txt");
  Bash(c(), b, "echo B > shared.txt && rm -f only-a.txt");
  EXPECT_EQ(Output(Bash(c(), a, "cat shared.txt")), "A\n");
  EXPECT_EQ(Output(Bash(c(), b, "cat shared.txt")), "B\n");
  EXPECT_EQ(Output(Bash(c(), b, "test -e only-a.txt && echo visible || echo absent")), "absent\n");
  EXPECT_EQ(Output(Bash(c(), a, "cat only-a.txt")), "A\n");
  EXPECT_EQ(e2e::ReadFile(ws_ / "shared.txt").value_or(""), "base\n") << "a session wrote to the base workspace";
  EXPECT_FALSE(e2e::Exists(ws_ / "only-a.txt"));
}

TEST_F(SessionsTest, DiffAppliesCleanlyToACloneOfTheBase) {
  MakeRepo(ws_.path(), {{"keep.txt", "keep\n"}, {"change.txt", "one\ntwo\nthree\n"}, {"gone.txt", "bye\n"}});
  std::string id = CreateSession(c(), ws_.path());
  json r = Bash(c(), id,
                "printf 'one\\n2\\nthree\\n' > change.txt && rm gone.txt && mkdir -p new/dir && "
                "printf 'fresh\\n' > new/dir/added.txt");
  ASSERT_EQ(r.value("exit_code", -1), 0) << r.dump();

  Answer diff = Call(c(), "GET", "/v1/sessions/" + id + "/diff");
  ASSERT_EQ(diff.status, 200) << diff.text;
  std::map<std::string, std::string> status;
  for (const auto& f : diff.body["files"]) status[f.value("path", "")] = f.value("status", "");
  EXPECT_EQ(status["change.txt"], "modified") << diff.text;
  EXPECT_EQ(status["gone.txt"], "deleted") << diff.text;
  EXPECT_EQ(status["new/dir/added.txt"], "added") << diff.text;
  EXPECT_EQ(status.count("keep.txt"), 0u) << diff.text;

  auto patch = d_.client().Call("GET", "/v1/sessions/" + id + "/diff?format=patch");
  ASSERT_TRUE(patch.ok()) << patch.status().ToString();
  EXPECT_EQ(patch->status, 200);
  EXPECT_EQ(patch->content_type, "text/x-diff");
  EXPECT_EQ(patch->body, diff.body.value("patch", ""));

  TempDir clone_parent("agentbox-session-clone-");
  const std::string clone = clone_parent / "clone";
  ASSERT_EQ(Git({"clone", "-q", ws_.path(), clone}, clone_parent.path()).status, 0);
  e2e::WriteFile(clone_parent / "session.patch", patch->body);
  auto check = Git({"apply", "--check", clone_parent / "session.patch"}, clone);
  ASSERT_EQ(check.status, 0) << check.Describe() << "\n" << patch->body;
  ASSERT_EQ(Git({"apply", clone_parent / "session.patch"}, clone).status, 0);
  EXPECT_EQ(e2e::ReadFile(clone + "/change.txt").value_or(""), "one\n2\nthree\n");
  EXPECT_FALSE(e2e::Exists(clone + "/gone.txt"));
  EXPECT_EQ(e2e::ReadFile(clone + "/new/dir/added.txt").value_or(""), "fresh\n");
  EXPECT_EQ(e2e::ReadFile(clone + "/keep.txt").value_or(""), "keep\n");

  // The base itself is as committed.
  EXPECT_EQ(Git({"status", "--porcelain"}, ws_.path()).out, "");
}

TEST_F(SessionsTest, SnapshotRestoresAndForks) {
  std::string a = CreateSession(c(), ws_.path());
  Bash(c(), a, "echo v1 > state.txt");
  Answer snap = Call(c(), "POST", "/v1/sessions/" + a + "/snapshot");
  ASSERT_EQ(snap.status, 201) << snap.text;
  const std::string snapshot = snap.body.value("snapshot_id", "");
  ASSERT_FALSE(snapshot.empty()) << snap.text;
  Bash(c(), a, "echo v2 > state.txt");  // after the snapshot: not in it

  std::string b = CreateSession(c(), ws_.path(), {{"from_snapshot", snapshot}});
  std::string f = CreateSession(c(), ws_.path(), {{"from_snapshot", snapshot}});
  ASSERT_FALSE(b.empty());
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(Output(Bash(c(), b, "cat state.txt")), "v1\n") << "restore";
  EXPECT_EQ(Output(Bash(c(), f, "cat state.txt")), "v1\n") << "fork";
  Bash(c(), b, "echo B > state.txt");
  Bash(c(), f, "echo F > state.txt");
  EXPECT_EQ(Output(Bash(c(), b, "cat state.txt")), "B\n") << "the forks share state";
  EXPECT_EQ(Output(Bash(c(), f, "cat state.txt")), "F\n") << "the forks share state";
  EXPECT_EQ(Output(Bash(c(), a, "cat state.txt")), "v2\n");
  EXPECT_FALSE(e2e::Exists(ws_ / "state.txt"));

  Answer missing = Call(c(), "POST", "/v1/sessions", {{"workspace", ws_.path()}, {"from_snapshot", "no-such-snapshot"}});
  EXPECT_TRUE(missing.status == 404 || missing.status == 400) << missing.text;
  EXPECT_TRUE(Contains(missing.message(), "no-such-snapshot")) << missing.text;
}

TEST_F(SessionsTest, ReplayingACallIdReturnsTheRecordedResultWithoutRunning) {
  std::string id = CreateSession(c(), ws_.path());
  const std::string once = "echo x >> counter && wc -l < counter";
  json first = Bash(c(), id, once, "call-1");
  ASSERT_EQ(Output(first), "1\n") << first.dump();
  EXPECT_EQ(first.value("replayed", true), false);
  EXPECT_EQ(first.value("call_id", ""), "call-1");

  json again = Bash(c(), id, once, "call-1");
  EXPECT_EQ(again.value("replayed", false), true) << again.dump();
  EXPECT_EQ(Output(again), "1\n");
  EXPECT_EQ(again.value("kind", ""), first.value("kind", "x"));
  EXPECT_EQ(again.value("exit_code", -1), first.value("exit_code", -2));

  EXPECT_EQ(Output(Bash(c(), id, "wc -l < counter")), "1\n") << "the replayed call ran again";
  EXPECT_EQ(Output(Bash(c(), id, once, "call-2")), "2\n") << "a new call id runs";

  // The log holds the call and its result.
  auto log = d_.client().Call("GET", "/v1/sessions/" + id + "/log");
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(log->status, 200);
  EXPECT_EQ(log->content_type, "application/x-ndjson");
  int lines_with_call = 0;
  for (const auto& line : e2e::Lines(log->body)) {
    auto j = json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "not JSON: " << line;
    if (Contains(line, "\"call-1\"")) ++lines_with_call;
  }
  EXPECT_GE(lines_with_call, 2) << log->body;
}

TEST_F(SessionsTest, StreamingDeliversOutputBeforeTheResult) {
  std::string id = CreateSession(c(), ws_.path());
  ASSERT_EQ(Output(Bash(c(), id, "true")), "");  // provisioned
  // The command waits until cancelled; the cancel is sent only once its
  // first output has arrived, so that output was streamed while it ran.
  std::vector<std::pair<std::string, std::string>> events;
  daemon::Client canceller(d_.endpoint());
  Answer cancel;
  daemon::SseParser sse([&](const std::string& event, const std::string& data) {
    events.emplace_back(event, data);
    if (event == "output" && cancel.status == 0 && Contains(data, "ready")) {
      cancel = Call(canceller, "POST", "/v1/sessions/" + id + "/calls/stream-1/cancel");
    }
  });
  json body = {{"name", "bash"}, {"input", {{"command", "echo ready; sleep 120; echo never"}}}, {"call_id", "stream-1"}};
  auto r = c().Call("POST", "/v1/sessions/" + id + "/execute?stream=1", body.dump(),
                    [&](std::string_view chunk) { sse.Feed(chunk); });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->content_type, "text/event-stream");
  EXPECT_EQ(cancel.status, 202) << cancel.text;
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.front().first, "output");
  EXPECT_EQ(events.back().first, "result");
  json result = json::parse(events.back().second);
  EXPECT_EQ(result.value("kind", ""), "cancelled") << result.dump();
  EXPECT_TRUE(Contains(result.value("output", ""), "ready"));
  EXPECT_FALSE(Contains(result.value("output", ""), "never"));
  std::string streamed;
  for (const auto& [event, data] : events) {
    if (event == "output") streamed += json::parse(data).get<std::string>();
  }
  EXPECT_EQ(streamed, "ready\n");

  // Cancelling a call that is not running.
  Answer none = Call(c(), "POST", "/v1/sessions/" + id + "/calls/stream-1/cancel");
  EXPECT_EQ(none.status, 404) << none.text;
}

TEST_F(SessionsTest, StreamingAnErrorBeforeRunningKeepsItsStatus) {
  auto r = c().Call("POST", "/v1/sessions/no-such-session/execute?stream=1",
                    json{{"name", "bash"}, {"input", {{"command", "true"}}}}.dump());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 404) << r->body;
  EXPECT_TRUE(Contains(r->body, "no-such-session")) << r->body;
}

TEST_F(SessionsTest, ListDescribeAndRemove) {
  std::string a = CreateSession(c(), ws_.path());
  std::string b = CreateSession(c(), ws_.path());
  Answer list = Call(c(), "GET", "/v1/sessions");
  ASSERT_EQ(list.status, 200) << list.text;
  std::vector<std::string> ids;
  for (const auto& s : list.body["sessions"]) ids.push_back(s.value("id", ""));
  EXPECT_NE(std::find(ids.begin(), ids.end(), a), ids.end()) << list.text;
  EXPECT_NE(std::find(ids.begin(), ids.end(), b), ids.end()) << list.text;
  Answer health = Call(c(), "GET", "/v1/health");
  EXPECT_EQ(health.body.value("sessions", 0), 2) << health.text;
  EXPECT_EQ(health.body.value("ok", false), true);

  Bash(c(), a, "true");
  const std::vector<pid_t> sandbox = d_.Descendants();
  ASSERT_FALSE(sandbox.empty());
  Answer removed = Call(c(), "DELETE", "/v1/sessions/" + a);
  EXPECT_EQ(removed.status, 204) << removed.text;
  EXPECT_TRUE(Daemon::WaitGone(sandbox, 10000)) << "the removed session's sandbox still runs";
  EXPECT_EQ(Call(c(), "GET", "/v1/sessions/" + a).status, 404);
  Answer exec = Call(c(), "POST", "/v1/sessions/" + a + "/execute", {{"name", "bash"}, {"input", {{"command", "true"}}}});
  EXPECT_EQ(exec.status, 404) << exec.text;
  EXPECT_EQ(Call(c(), "DELETE", "/v1/sessions/" + a).status, 404);
}

TEST_F(SessionsTest, FiftyConcurrentSessionsEachRunCommands) {
  constexpr int kSessions = 50;
  std::vector<std::string> failures(kSessions);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      daemon::Client client(d_.endpoint());
      auto fail = [&](const std::string& what, const Answer& a) {
        failures[i] = what + ": HTTP " + std::to_string(a.status) + ": " + a.text.substr(0, 500);
      };
      Answer created = Call(client, "POST", "/v1/sessions", {{"workspace", ws_.path()}});
      if (created.status != 201) return fail("create", created);
      const std::string id = created.body["id"];
      const std::string mine = std::to_string(i);
      const std::vector<std::string> commands = {"echo " + mine + " > mine.txt", "cat mine.txt",
                                                 "echo $(( $(cat mine.txt) * 2 ))"};
      for (const std::string& command : commands) {
        Answer a = Call(client, "POST", "/v1/sessions/" + id + "/execute",
                        {{"name", "bash"}, {"input", {{"command", command}}}});
        if (a.status != 200 || a.body.value("exit_code", -1) != 0) return fail(command, a);
        if (command == "cat mine.txt" && a.body.value("output", "") != mine + "\n") return fail("isolation", a);
        if (command.rfind("echo $((", 0) == 0 && a.body.value("output", "") != std::to_string(2 * i) + "\n") {
          return fail("arithmetic", a);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kSessions; ++i) EXPECT_EQ(failures[i], "") << "session " << i;
  EXPECT_EQ(Call(c(), "GET", "/v1/health").body.value("sessions", 0), kSessions);
  EXPECT_FALSE(e2e::Exists(ws_ / "mine.txt"));
}


// A secret in the daemon's environment is nowhere a session can look: not
// in a command's environment, not in /proc/*/environ or cmdline, and not
// through any file tool (edit_file was an oracle on /proc/self/environ).
TEST(SessionsEnvironmentTest, TheDaemonsEnvironmentReachesNoSession) {
  const std::string secret = "daemon-planted-" + std::to_string(getpid()) + "-Hq3vXb";
  Daemon d;
  d.extra_env = {"AGENTBOX_TEST_DAEMON_SECRET=" + secret};
  ASSERT_TRUE(d.Start()) << d.error();
  TempDir ws{"agentbox-session-ws-"};
  std::string id = CreateSession(d.client(), ws.path());
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(0, symlink("/proc/self/environ", (ws.path() + "/env-link").c_str()));
  std::vector<json> answers;
  answers.push_back(Bash(d.client(), id,
                         "env; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do echo \"== $f\"; "
                         "tr '\\0' '\\n' < $f 2>&1; done; true"));
  for (const std::string path : {"/proc/self/environ", "env-link"}) {
    answers.push_back(Execute(d.client(), id, "read_file", {{"path", path}}));
    json right = Execute(d.client(), id, "edit_file", {{"path", path}, {"old", "AGENTBOX_TEST_DAEMON_SECRET="}, {"new", "x"}});
    json wrong = Execute(d.client(), id, "edit_file", {{"path", path}, {"old", "NO_SUCH_VARIABLE_ANYWHERE="}, {"new", "x"}});
    EXPECT_EQ(right.value("output", ""), wrong.value("output", "")) << "a right guess answers differently";
    EXPECT_EQ(right.value("kind", ""), "tool_error") << right.dump();
    answers.push_back(right);
    answers.push_back(Execute(d.client(), id, "write_file", {{"path", path}, {"content", "x"}}));
  }
  answers.push_back(Execute(d.client(), id, "list_dir", {{"path", "/proc/self"}}));
  answers.push_back(Execute(d.client(), id, "glob", {{"pattern", "/proc/*/environ"}}));
  for (const json& a : answers) {
    EXPECT_EQ(a.dump().find(secret), std::string::npos) << a.dump();
    EXPECT_EQ(a.dump().find("AGENTBOX_PLAN"), std::string::npos) << a.dump();
  }
  EXPECT_TRUE(Contains(Output(answers.front()), "PATH=")) << answers.front().dump();
}

// A session's tree nested deeper than its host layer's path can name: diff
// and snapshot answer a named error, not 500 internal.
TEST_F(SessionsTest, DiffAndSnapshotOfATooDeepTreeAnswerANamedError) {
  std::string id = CreateSession(c(), ws_.path());
  const std::string pwd = Output(Bash(c(), id, "pwd"));
  ASSERT_FALSE(pwd.empty());
  const std::size_t inside = pwd.size() - 1;
  const std::size_t depth = (4080 - inside) / 201;
  const std::size_t last = 4080 - inside - depth * 201 - 1;
  json made = Bash(c(), id, "d=$(printf 'd%.0s' $(seq 200)); for i in $(seq " + std::to_string(depth) +
                                "); do mkdir $d && cd $d || exit 1; done; l=$(printf 'e%.0s' $(seq " +
                                std::to_string(last) + ")); echo deep > $l && echo made");
  ASSERT_TRUE(Contains(Output(made), "made")) << made.dump();
  for (const auto& [method, route] : {std::pair<std::string, std::string>{"GET", "/diff"}, {"POST", "/snapshot"}}) {
    Answer a = Call(c(), method, "/v1/sessions/" + id + route);
    EXPECT_NE(a.status, 500) << route << ": " << a.text;
    if (a.status != 200) {
      EXPECT_EQ(a.status, 422) << a.text;
      EXPECT_EQ(a.body["error"].value("code", ""), "path_too_long") << a.text;
    }
  }
}

}  // namespace
}  // namespace agentbox::session_test
