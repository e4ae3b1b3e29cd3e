// Sessions on sandbox.isolation: remote over SSH: the world is another
// agentbox reached through the system's ssh client, here a real sshd the
// test starts on 127.0.0.1 (ssh_host.h). Every call, the file tools
// included, runs there, confined by the remote's own enforcement.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <thread>
#include <vector>

#include "daemon_fixture.h"
#include "ssh_host.h"

namespace agentbox::session_test {
namespace {

using e2e::Contains;
using e2e::TempDir;

std::string Output(const json& result) { return result.value("output", ""); }

class RemoteSession : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = SshHost::WhyNot(); !why.empty()) GTEST_SKIP() << "not applicable here: " << why;
    ASSERT_EQ(host_->Start(), "");
    ASSERT_TRUE(d_.Start()) << d_.error();
  }
  void TearDown() override {
    d_.Signal(SIGTERM);
    d_.WaitExit(10000);
    host_->Stop();
  }
  daemon::Client& c() { return d_.client(); }
  std::string Create(const std::string& policy) { return CreateSession(c(), ws_.path(), {{"policy", policy}}); }
  json Describe(const std::string& id) { return Call(c(), "GET", "/v1/sessions/" + id).body; }
  std::string InstalledBinaries() {
    e2e::Command ls;
    ls.argv = {"/bin/sh", "-c", "ls \"$0\" 2>/dev/null", host_->cache_dir() + "/agentbox/bin"};
    ls.env = {"PATH=/usr/bin:/bin"};
    return e2e::RunCommand(ls).out;
  }

  TempDir ws_{"agentbox-session-ws-"};
  std::unique_ptr<SshHost> host_ = std::make_unique<SshHost>();
  Daemon d_;
};

TEST_F(RemoteSession, OneWorldOnTheRemoteServesTheCallsAndTheFileToolsSeeWhatTheShellSees) {
  e2e::WriteFile(ws_.path() + "/base.txt", "from the base\n");
  const std::string id = Create(host_->Policy());
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(InstalledBinaries(), "") << "something was installed before the first call (provisioning is lazy)";

  json first = Bash(c(), id, "cat base.txt; echo warm > /tmp/warm");
  ASSERT_EQ(first.value("kind", ""), "exited") << first.dump();
  EXPECT_EQ(Output(first), "from the base\n");
  // The report is the remote's: its own backend and Landlock, named as remote.
  const json& enforcement = first["outcome"]["enforcement"];
  EXPECT_EQ(enforcement.value("backend", ""), "linux-namespaces") << enforcement.dump();
  EXPECT_EQ(enforcement.value("level", ""), "full") << enforcement.dump();
  EXPECT_TRUE(Contains(enforcement.value("backend_reason", ""), "remote over ssh to testremote")) << enforcement.dump();

  // It ran under the test's sshd: the remote's world process descends from it.
  json d = Describe(id);
  ASSERT_TRUE(d.contains("remote")) << d.dump();
  const pid_t remote_pid = d["remote"].value("remote_pid", 0);
  ASSERT_GT(remote_pid, 0) << d.dump();
  bool under_sshd = false;
  for (pid_t p = remote_pid; p > 1; p = ParentOf(p)) under_sshd = under_sshd || p == host_->pid();
  EXPECT_TRUE(under_sshd) << "the world's agentbox (pid " << remote_pid << ") is not a process of the test's sshd";
  EXPECT_EQ(d["remote"].value("binary", ""), "installed") << d.dump();
  EXPECT_NE(InstalledBinaries().find("agentbox-"), std::string::npos) << "no binary installed by digest";

  // One world across calls: its /tmp stays, its world process too.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Output(Bash(c(), id, "cat /tmp/warm")), "warm\n");
  EXPECT_EQ(Describe(id)["remote"].value("remote_pid", 0), remote_pid) << "a new remote world between warm calls";

  // The file tools and the shell share the remote's files.
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
  json list = Execute(c(), id, "list_dir", {{"path", "notes"}});
  EXPECT_TRUE(Contains(Output(list), "from-tool.txt")) << list.dump();

  // fresh_per_task: the session's copy is the remote's; the base is untouched.
  EXPECT_FALSE(e2e::Exists(ws_.path() + "/from-shell.txt"));
  EXPECT_TRUE(e2e::Exists(host_->state_dir() + "/agentbox/remote/" + id + "/copy/from-shell.txt"));

  // A second session finds the binary there, checked by its digest.
  const std::string second = Create(host_->Policy());
  ASSERT_EQ(Bash(c(), second, "true").value("kind", ""), "exited");
  EXPECT_EQ(Describe(second)["remote"].value("binary", ""), "present");

  // Removing the session removes its copy on the remote.
  ASSERT_EQ(Call(c(), "DELETE", "/v1/sessions/" + id).status, 204);
  EXPECT_FALSE(e2e::Exists(host_->state_dir() + "/agentbox/remote/" + id));
}

TEST_F(RemoteSession, DiffSnapshotAndApplyAreDoneOnTheRemotesCopy) {
  e2e::WriteFile(ws_.path() + "/base.txt", "one\n");
  const std::string id = Create(host_->Policy());
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(Bash(c(), id, "echo two >> base.txt; echo new > added.txt").value("exit_code", -1), 0);

  Answer diff = Call(c(), "GET", "/v1/sessions/" + id + "/diff");
  ASSERT_EQ(diff.status, 200) << diff.text;
  const std::string patch = diff.body.value("patch", "");
  EXPECT_TRUE(Contains(patch, "+two")) << diff.text;
  EXPECT_TRUE(Contains(patch, "added.txt")) << diff.text;
  EXPECT_EQ(diff.body["files"].size(), 2u) << diff.text;

  Answer snap = Call(c(), "POST", "/v1/sessions/" + id + "/snapshot");
  ASSERT_EQ(snap.status, 201) << snap.text;
  const std::string snap_id = snap.body.value("snapshot_id", "");
  ASSERT_FALSE(snap_id.empty());
  EXPECT_TRUE(e2e::Exists(host_->state_dir() + "/agentbox/remote-snapshots/" + snap_id + "/manifest.json"))
      << "the snapshot is not kept on the remote";

  // Apply writes into the remote's workspace (on this test's one machine,
  // the directory the session was created on).
  Answer apply = Call(c(), "POST", "/v1/sessions/" + id + "/apply");
  ASSERT_EQ(apply.status, 200) << apply.text;
  EXPECT_EQ(apply.body["applied"].size(), 2u) << apply.text;
  EXPECT_EQ(e2e::ReadFile(ws_.path() + "/base.txt").value_or(""), "one\ntwo\n");
  EXPECT_EQ(e2e::ReadFile(ws_.path() + "/added.txt").value_or(""), "new\n");
  // A base changed since the copy is a conflict: nothing is written.
  ASSERT_EQ(Bash(c(), id, "echo three >> base.txt").value("exit_code", -1), 0);
  e2e::WriteFile(ws_.path() + "/base.txt", "changed outside\n");
  Answer conflict = Call(c(), "POST", "/v1/sessions/" + id + "/apply");
  ASSERT_EQ(conflict.status, 409) << conflict.text;
  EXPECT_EQ(conflict.code(), "conflict") << conflict.text;
  EXPECT_EQ(conflict.body["error"]["conflicts"], json::array({"base.txt"})) << conflict.text;
  EXPECT_EQ(e2e::ReadFile(ws_.path() + "/base.txt").value_or(""), "changed outside\n");
}

// A remote session's snapshot is kept on its remote and listed here; it
// outlives its session, a session on the same remote starts from it (its
// copy there made from the snapshot's tree), a local session or another
// remote cannot, and deleting it removes the tree on the remote.
TEST_F(RemoteSession, ASnapshotKeptOnTheRemoteOutlivesItsSessionAndStartsAnother) {
  e2e::WriteFile(ws_.path() + "/base.txt", "one\n");
  const std::string first = Create(host_->Policy());
  ASSERT_FALSE(first.empty());
  ASSERT_EQ(Bash(c(), first, "echo two >> base.txt; mkdir -p deep/er; echo kept > deep/er/made.txt")
                .value("exit_code", -1),
            0);
  Answer snap = Call(c(), "POST", "/v1/sessions/" + first + "/snapshot", {{"keep", true}});
  ASSERT_EQ(snap.status, 201) << snap.text;
  const std::string snap_id = snap.body.value("snapshot_id", "");
  ASSERT_FALSE(snap_id.empty());
  const std::string on_remote = host_->state_dir() + "/agentbox/remote-snapshots/" + snap_id;
  ASSERT_TRUE(e2e::Exists(on_remote + "/tree/deep/er/made.txt")) << "the snapshot's tree is not on the remote";
  // One not kept goes with its session, here and there.
  Answer passing = Call(c(), "POST", "/v1/sessions/" + first + "/snapshot");
  ASSERT_EQ(passing.status, 201) << passing.text;
  const std::string passing_on_remote =
      host_->state_dir() + "/agentbox/remote-snapshots/" + passing.body.value("snapshot_id", "");
  ASSERT_TRUE(e2e::Exists(passing_on_remote + "/manifest.json"));

  // Listed with the others, as the remote's.
  Answer list = Call(c(), "GET", "/v1/snapshots");
  ASSERT_EQ(list.status, 200) << list.text;
  json listed;
  for (const json& s : list.body["snapshots"]) {
    if (s.value("id", "") == snap_id) listed = s;
  }
  ASSERT_TRUE(listed.is_object()) << list.text;
  EXPECT_EQ(listed.value("mode", ""), "remote") << listed.dump();
  EXPECT_EQ(listed.value("session", ""), first) << listed.dump();
  EXPECT_TRUE(Contains(listed.value("remote", ""), "testremote")) << listed.dump();

  // It outlives its session (the session's copy there goes).
  ASSERT_EQ(Call(c(), "DELETE", "/v1/sessions/" + first).status, 204);
  EXPECT_FALSE(e2e::Exists(host_->state_dir() + "/agentbox/remote/" + first));
  ASSERT_TRUE(e2e::Exists(on_remote + "/manifest.json"));
  EXPECT_FALSE(e2e::Exists(passing_on_remote)) << "a snapshot not kept outlived its session on the remote";
  Answer after = Call(c(), "GET", "/v1/snapshots");
  EXPECT_FALSE(Contains(after.text, passing.body.value("snapshot_id", "-"))) << after.text;

  // A session on the same remote starts from it: the calls see the
  // snapshot's files, the workspace is untouched, and diff is against it.
  const std::string second = CreateSession(c(), ws_.path(), {{"policy", host_->Policy()}, {"from_snapshot", snap_id}});
  ASSERT_FALSE(second.empty());
  EXPECT_EQ(Output(Bash(c(), second, "cat base.txt deep/er/made.txt")), "one\ntwo\nkept\n");
  EXPECT_EQ(e2e::ReadFile(ws_.path() + "/base.txt").value_or(""), "one\n");
  EXPECT_FALSE(e2e::Exists(ws_.path() + "/deep"));
  Answer diff = Call(c(), "GET", "/v1/sessions/" + second + "/diff");
  ASSERT_EQ(diff.status, 200) << diff.text;
  EXPECT_TRUE(Contains(diff.body.value("patch", ""), "+two")) << diff.text;
  EXPECT_EQ(Describe(second).value("from_snapshot", ""), snap_id);

  // Not a local session's start, nor a session's on another remote.
  Answer local = Call(c(), "POST", "/v1/sessions",
                      {{"workspace", ws_.path()}, {"policy", "mode: workspace-write\n"}, {"from_snapshot", snap_id}});
  EXPECT_EQ(local.status, 409) << local.text;
  EXPECT_TRUE(Contains(local.text, "kept on the remote")) << local.text;
  std::string elsewhere = host_->Policy();
  const std::string dest = "testremote";
  ASSERT_NE(elsewhere.find(dest), std::string::npos) << elsewhere;
  elsewhere.replace(elsewhere.find(dest), dest.size(), "otherremote");
  Answer other = Call(c(), "POST", "/v1/sessions",
                      {{"workspace", ws_.path()}, {"policy", elsewhere}, {"from_snapshot", snap_id}});
  EXPECT_EQ(other.status, 409) << other.text;
  EXPECT_TRUE(Contains(other.text, "otherremote")) << other.text;

  // Deleted: its tree goes from the remote, and nothing starts from it.
  Answer gone = Call(c(), "DELETE", "/v1/snapshots/" + snap_id);
  EXPECT_EQ(gone.status, 204) << gone.text;
  EXPECT_FALSE(e2e::Exists(on_remote)) << "the snapshot's tree is still on the remote";
  Answer none = Call(c(), "POST", "/v1/sessions",
                     {{"workspace", ws_.path()}, {"policy", host_->Policy()}, {"from_snapshot", snap_id}});
  EXPECT_EQ(none.status, 404) << none.text;
  // The session made from it keeps its own copy.
  EXPECT_EQ(Output(Bash(c(), second, "cat deep/er/made.txt")), "kept\n");
}

// The secret's value goes from the daemon's environment to the remote
// world's memory over the stream: the world starts (its supervisor waits
// for the values before anything runs), the sandbox sees the placeholder,
// and the value is in no file the remote wrote, no command line and no
// environment of the remote's processes.
TEST_F(RemoteSession, ASecretReachesTheRemoteOverTheStreamOnlyAndNeverItsDisk) {
  const std::string value = "remote-secret-" + e2e::RandomHex(12);
  Daemon d;
  d.extra_env = {"AGENTBOX_REMOTE_TEST_TOKEN=" + value};
  ASSERT_TRUE(d.Start()) << d.error();
  const std::string policy =
      host_->Policy("os", "network:\n  allow: [\"api.test\"]\ncredentials:\n  secrets:\n    api:\n"
                          "      from: { env: AGENTBOX_REMOTE_TEST_TOKEN }\n      hosts: [api.test]\n"
                          "      inject: { header: Authorization, format: \"Bearer {}\" }\n"
                          "      placeholder_env: API_TOKEN\n");
  const std::string id = CreateSession(d.client(), ws_.path(), {{"policy", policy}});
  ASSERT_FALSE(id.empty());
  json r = Bash(d.client(), id, "printf '%s' \"$API_TOKEN\"");
  ASSERT_EQ(r.value("kind", ""), "exited") << r.dump();
  EXPECT_FALSE(Output(r).empty()) << "no placeholder inside";
  EXPECT_FALSE(Contains(Output(r), value)) << "the value itself is inside the sandbox";
  // Nothing the remote wrote holds it.
  e2e::Command grep;
  grep.argv = {"/bin/grep", "-rlF", "--", value, host_->cache_dir(), host_->state_dir()};
  grep.env = {"PATH=/usr/bin:/bin"};
  e2e::RunResult found = e2e::RunCommand(grep);
  EXPECT_EQ(found.status, 1) << "the value is on the remote's disk: " << found.out << found.err;
  // No process of the remote's carries it in its command line or environment.
  const std::vector<pid_t> remote = ProcessTree(host_->pid());
  ASSERT_FALSE(remote.empty());
  for (pid_t p : remote) {
    for (const char* what : {"cmdline", "environ"}) {
      const std::string text = e2e::ReadFile("/proc/" + std::to_string(p) + "/" + what).value_or("");
      EXPECT_FALSE(Contains(text, value)) << "pid " << p << "'s " << what << " holds the value";
    }
  }
  d.Signal(SIGTERM);
  d.WaitExit(10000);
}

TEST_F(RemoteSession, ARemoteWorldKilledDuringACallInterruptsItAndTheNextCallProvisionsAgain) {
  const std::string id = Create(host_->Policy());
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(Bash(c(), id, "echo ready").value("kind", ""), "exited");
  // The remote's pid from the session's description (0, and the description
  // shown, where it has none).
  auto remote_pid_of = [&](const std::string& session) {
    const json d = Describe(session);
    const json remote = d.is_object() && d.contains("remote") ? d["remote"] : json();
    const pid_t pid = remote.is_object() ? remote.value("remote_pid", 0) : 0;
    EXPECT_GT(pid, 0) << "no remote pid in the description: " << d.dump();
    return pid;
  };
  const pid_t remote_pid = remote_pid_of(id);
  ASSERT_GT(remote_pid, 0);

  // "started" is written before runs.txt appears, and has a moment to
  // cross the ssh stream before the kill: output still in the remote's
  // pipes when it dies never left it, and is not what this checks.
  static const char kCommand[] = "echo started; echo ran >> runs.txt; sleep 60; echo finished";
  json result;
  std::thread call([&] {
    daemon::Client own(d_.endpoint());
    result = Bash(own, id, kCommand, "call-1");
  });
  // Once the command runs there, the remote's world is killed.
  const long deadline = e2e::NowMs() + 20000;
  while (e2e::NowMs() < deadline && !e2e::Exists(host_->state_dir() + "/agentbox/remote/" + id + "/copy/runs.txt")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_EQ(kill(remote_pid, SIGKILL), 0);
  call.join();
  ASSERT_TRUE(result.is_object()) << "the interrupted call's answer: " << result.dump();
  EXPECT_EQ(result.value("kind", ""), "interrupted") << result.dump();
  EXPECT_TRUE(Contains(Output(result), "started")) << "what the call wrote before is lost: " << result.dump();
  EXPECT_FALSE(Contains(Output(result), "finished")) << result.dump();

  // Replaying the call returns its record; it never runs twice.
  json replay = Bash(c(), id, kCommand, "call-1");
  EXPECT_EQ(replay.value("replayed", false), true) << replay.dump();
  EXPECT_EQ(replay.value("kind", ""), "interrupted") << replay.dump();

  // The next call gets a world provisioned again, on the same remote copy.
  json after = Bash(c(), id, "cat runs.txt");
  ASSERT_EQ(after.value("kind", ""), "exited") << after.dump();
  EXPECT_EQ(Output(after), "ran\n");
  EXPECT_NE(remote_pid_of(id), remote_pid);
  bool said = false;
  for (const auto& line : e2e::Lines(Call(c(), "GET", "/v1/sessions/" + id + "/log").text)) {
    json e = json::parse(line, nullptr, false);
    if (e.is_object() && e.value("event", "") == "reprovisioned" &&
        Contains(e.value("reason", ""), "connection to the remote world")) {
      said = true;
    }
  }
  EXPECT_TRUE(said) << "the log does not say the world was provisioned again after the connection dropped";
}

TEST_F(RemoteSession, AHostKeyThatDoesNotMatchIsRefusedAndNothingRunsThere) {
  host_->TrustKey("other_host_key");
  const std::string id = Create(host_->Policy());
  ASSERT_FALSE(id.empty());
  json r = Bash(c(), id, "echo should-not-run");
  EXPECT_EQ(r.value("kind", ""), "sandbox_error") << r.dump();
  EXPECT_TRUE(Contains(Output(r), "Host key verification failed")) << r.dump();
  EXPECT_FALSE(Contains(Output(r), "should-not-run")) << r.dump();
  EXPECT_EQ(InstalledBinaries(), "") << "agentbox was copied to a host whose key did not match";
}

TEST_F(RemoteSession, AnUnknownHostKeyIsNeitherAcceptedNorLearnt) {
  host_->TrustKey("");
  const std::string id = Create(host_->Policy());
  ASSERT_FALSE(id.empty());
  json r = Bash(c(), id, "true");
  EXPECT_EQ(r.value("kind", ""), "sandbox_error") << r.dump();
  EXPECT_TRUE(Contains(Output(r), "Host key verification failed")) << r.dump();
  EXPECT_EQ(e2e::ReadFile(host_->known_hosts()).value_or("?"), "") << "the unknown key was written to known_hosts";
  EXPECT_EQ(InstalledBinaries(), "");
}

class RemoteWithoutUserNamespaces : public RemoteSession {
 protected:
  void SetUp() override {
    host_ = std::make_unique<SshHost>(SshHost::Kind::kNoUserNamespaces);
    RemoteSession::SetUp();
  }
};

TEST_F(RemoteWithoutUserNamespaces, TheRemoteRefusesWithItsOwnReason) {
  // The host fact: here, user namespaces can be made at all (else the
  // remote's want of them would prove nothing about the remote's check).
  e2e::Command unshare;
  unshare.argv = {e2e::FindTool("unshare"), "--user", "--map-root-user", "/bin/true"};
  e2e::RunResult probe = e2e::RunCommand(unshare);
  if (probe.status != 0) GTEST_SKIP() << "not applicable here: this host makes no user namespace: " << probe.err;
  const std::string id = Create(host_->Policy());
  ASSERT_FALSE(id.empty());
  json r = Bash(c(), id, "echo should-not-run");
  EXPECT_EQ(r.value("kind", ""), "sandbox_error") << r.dump();
  const std::string out = Output(r);
  EXPECT_TRUE(Contains(out, "refuses")) << out;
  EXPECT_TRUE(Contains(out, "user namespace")) << out;
  EXPECT_FALSE(Contains(out, "should-not-run")) << out;
}

TEST_F(RemoteSession, ATenMiBFileReadsWholeThroughReadFile) {
  const std::string id = Create(host_->Policy());
  ASSERT_FALSE(id.empty());
  // 10240 lines of 1 KiB: 10 MiB, read in pages of 1000 lines.
  json made = Bash(c(), id, "awk 'BEGIN { for (i = 0; i < 10240; i++) printf \"%07d %01015d\\n\", i, 0 }' > big.txt; "
                            "wc -c < big.txt");
  ASSERT_EQ(Output(made), "10485760\n") << made.dump();
  // Paged as an agent pages: from each answer's next_offset, or past its last line.
  std::size_t bytes = 0;
  int next = 0;
  std::string pages;
  for (int offset = 1; offset <= 10240;) {
    json page = Execute(c(), id, "read_file", {{"path", "big.txt"}, {"offset", offset}, {"limit", 1000}});
    ASSERT_EQ(page.value("is_error", true), false) << page.dump().substr(0, 400);
    const std::string text = Output(page);
    int lines = 0;
    for (const auto& line : e2e::Lines(text)) {
      if (line.rfind("[truncated:", 0) == 0) continue;
      ASSERT_EQ(line.substr(0, 8), std::to_string(next + 10000000).substr(1) + " ") << "line " << next << " of page at "
                                                                                    << offset;
      EXPECT_EQ(line.size(), 1023u) << "line " << next << " of page at " << offset << ": " << line.substr(0, 40)
                                    << "..." << line.substr(line.size() > 40 ? line.size() - 40 : 0);
      bytes += line.size() + 1;
      ++next;
      ++lines;
    }
    pages += std::to_string(offset) + ":" + std::to_string(lines) + " ";
    ASSERT_GT(lines, 0) << pages;
    offset = page.value("truncated", false) ? page.value("next_offset", offset + lines) : offset + lines;
  }
  EXPECT_EQ(next, 10240) << pages;
  EXPECT_EQ(bytes, 10485760u) << pages;
}

}  // namespace
}  // namespace agentbox::session_test
