// Sessions through the Manager, against real sandboxes: the world's
// semantics below the daemon (which tests/session covers over HTTP).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "agentbox/confine.h"
#include "agentbox/host_caps.h"
#include "agentbox/policy.h"
#include "host_facts.h"
#include "session/session.h"
#include "world_helpers.h"
#include "session/world.h"

namespace agentbox::session {
namespace {

using world_test::Bin;
using world_test::Children;
using world_test::Read;

std::string MakeTemp(const char* what) {
  std::string t = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/agentbox-world-" + what + ".XXXXXX";
  return mkdtemp(t.data()) ? t : "";
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }
class WorldTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(Bin().empty()) << "AGENTBOX_BIN must name the agentbox binary";
    state_ = MakeTemp("state");
    base_ = MakeTemp("base");
    ASSERT_FALSE(state_.empty());
    ASSERT_FALSE(base_.empty());
    ASSERT_EQ(0, system(("git -C " + base_ + " init -q 2>/dev/null").c_str()));
    Write(base_ + "/a.txt", "base\n");
    Open();
  }
  void TearDown() override {
    manager_.reset();
    // overlayfs leaves its work directory mode 0000: open it up first.
    system(("chmod -R u+rwx " + state_ + " 2>/dev/null; rm -rf " + state_ + " " + base_).c_str());
    EXPECT_TRUE(Children().empty()) << "a world's process outlived its Manager";
  }
  void Open(const std::string& mode = "auto") {
    manager_.reset();
    ManagerOptions o;
    o.state_dir = state_;
    o.agentbox_exe = Bin();
    o.workspace_mode = mode;
    o.output_cap_bytes = 64 * 1024;
    auto m = Manager::Open(o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    manager_ = std::move(*m);
  }
  std::string Create(const std::string& policy = "", const std::string& snapshot = "") {
    CreateRequest c;
    c.workspace = base_;
    c.policy_yaml = policy;
    c.from_snapshot = snapshot;
    auto id = manager_->Create(c);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : "";
  }
  Json Bash(const std::string& id, const std::string& command, Json extra = Json::object()) {
    extra["command"] = command;
    auto r = manager_->Execute(id, "bash", extra);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : Json();
  }
  Json Tool(const std::string& id, const std::string& name, const Json& input) {
    auto r = manager_->Execute(id, name, input);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : Json();
  }

  std::string state_, base_;
  std::unique_ptr<Manager> manager_;
};

TEST_F(WorldTest, NothingRunsBeforeTheFirstCall) {
  std::string id = Create();
  EXPECT_TRUE(Children().empty());
  EXPECT_FALSE((*manager_->Describe(id))["provisioned"].get<bool>());
  Json r = Bash(id, "echo hello; stat -c %a .");
  EXPECT_EQ(r["kind"], "exited");
  struct stat base_st {};
  ASSERT_EQ(stat(base_.c_str(), &base_st), 0);
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%o", base_st.st_mode & 0777);
  EXPECT_EQ(r["output"], std::string("hello\n") + mode + "\n");  // the workspace keeps the base's mode
  EXPECT_EQ(Children().size(), 1u);
  EXPECT_TRUE((*manager_->Describe(id))["provisioned"].get<bool>());
}

TEST_F(WorldTest, OneWorldAcrossCalls) {
  std::string id = Create();
  // What one call leaves in the world's own /tmp is there for the next: the
  // same mount namespace, the same init (and what it left running,
  // services_test.cc).
  Json r = Bash(id, "echo kept > /tmp/one-world; stat -c %i /proc/1");
  const std::string init_inode = r["output"];
  r = Bash(id, "cat /tmp/one-world; stat -c %i /proc/1");
  EXPECT_EQ(r["output"], "kept\n" + init_inode);
  r = Bash(id, "echo $$; readlink /proc/1/exe >/dev/null 2>&1; cat /proc/1/comm");
  EXPECT_NE(r["output"].get<std::string>().find("agentbox-init"), std::string::npos) << r["output"];
}

TEST_F(WorldTest, FileToolsAndShellSeeOneWorld) {
  std::string id = Create();
  Json w = Tool(id, "write_file", {{"path", "notes/todo.txt"}, {"content", "from the tool\n"}});
  // The parent is missing: either created or a clear error; make it first.
  if (w["kind"] != "ok") {
    Bash(id, "mkdir -p notes");
    w = Tool(id, "write_file", {{"path", "notes/todo.txt"}, {"content", "from the tool\n"}});
  }
  ASSERT_EQ(w["kind"], "ok") << w.dump();
  EXPECT_EQ(Bash(id, "cat notes/todo.txt")["output"], "from the tool\n");
  Bash(id, "echo 'from the shell' > shell.txt");
  Json r = Tool(id, "read_file", {{"path", "shell.txt"}});
  EXPECT_NE(r["output"].get<std::string>().find("from the shell"), std::string::npos) << r.dump();
  // /tmp is the sandbox's own: a file the shell puts there is the one the tool reads.
  Bash(id, "echo private > /tmp/only-inside");
  r = Tool(id, "read_file", {{"path", "/tmp/only-inside"}});
  EXPECT_NE(r["output"].get<std::string>().find("private"), std::string::npos) << r.dump();
  struct stat st {};
  EXPECT_NE(stat("/tmp/only-inside", &st), 0) << "the sandbox's /tmp reached the host";
  // The base workspace is untouched until a diff is applied.
  EXPECT_NE(stat((base_ + "/shell.txt").c_str(), &st), 0);
  EXPECT_EQ(Read(base_ + "/a.txt"), "base\n");
}

TEST_F(WorldTest, ProtectedAndDeniedPathsAreDeniedToToolsAsToTheShell) {
  std::string id = Create();
  Json shell = Bash(id, "echo x > .git/config");
  EXPECT_EQ(shell["kind"], "sandbox_denied") << shell.dump();
  Json tool = Tool(id, "write_file", {{"path", ".git/config"}, {"content", "[core]\n"}});
  EXPECT_EQ(tool["kind"], "sandbox_denied") << tool.dump();
  EXPECT_TRUE(tool["is_error"].get<bool>());
  EXPECT_EQ(tool["output"].get<std::string>().rfind("sandbox_denied", 0), 0u) << tool["output"];
  Json edit = Tool(id, "edit_file", {{"path", ".git/config"}, {"old", "[core]"}, {"new", "[x]"}});
  EXPECT_NE(edit["kind"], "ok") << edit.dump();
  // A path the policy masks: the tool cannot read it either.
  Json shadow = Tool(id, "read_file", {{"path", "/etc/shadow"}});
  EXPECT_EQ(shadow["kind"], "sandbox_denied") << shadow.dump();
  // Outside the workspace and the sandbox's private dirs nothing is writable.
  Json etc = Tool(id, "write_file", {{"path", "/etc/agentbox-escape"}, {"content", "x"}});
  EXPECT_EQ(etc["kind"], "sandbox_denied") << etc.dump();
  struct stat st {};
  EXPECT_NE(stat("/etc/agentbox-escape", &st), 0);
}

TEST_F(WorldTest, SessionsOnOneBaseDoNotSeeEachOther) {
  std::string one = Create(), two = Create();
  if (Read("/proc/filesystems").find("\toverlay\n") != std::string::npos) {
    EXPECT_EQ((*manager_->Describe(one))["mode"], "overlay");
  }
  Bash(one, "echo one > a.txt; echo mine > only-one.txt");
  Json r = Bash(two, "cat a.txt; ls");
  EXPECT_EQ(r["output"].get<std::string>().substr(0, 5), "base\n");
  EXPECT_EQ(r["output"].get<std::string>().find("only-one"), std::string::npos);
  EXPECT_EQ(Read(base_ + "/a.txt"), "base\n");
  auto diff = manager_->Diff(one);
  ASSERT_TRUE(diff.ok()) << diff.status().ToString();
  ASSERT_EQ((*diff)["files"].size(), 2u) << diff->dump();
  auto diff2 = manager_->Diff(two);
  ASSERT_TRUE(diff2.ok());
  EXPECT_TRUE((*diff2)["files"].empty());
}

TEST_F(WorldTest, DiffAppliesToTheBaseWithGitApply) {
  std::string id = Create();
  Bash(id, "printf 'base\\nmore\\n' > a.txt; mkdir -p src && echo 'int main(){}' > src/m.c");
  auto diff = manager_->Diff(id);
  ASSERT_TRUE(diff.ok());
  Write(state_ + "/p.diff", (*diff)["patch"].get<std::string>());
  ASSERT_EQ(0, system(("cd " + base_ + " && git apply " + state_ + "/p.diff").c_str()));
  EXPECT_EQ(Read(base_ + "/a.txt"), "base\nmore\n");
  EXPECT_EQ(Read(base_ + "/src/m.c"), "int main(){}\n");
}

// What a world shows of the host: its overlay's layers and its init's
// command line name neither the state directory nor the session.
TEST_F(WorldTest, MountinfoAndInitCmdlineNameNoStatePathNorSession) {
  std::string id = Create();
  if ((*manager_->Describe(id))["mode"] != "overlay") {
    GTEST_SKIP() << "not applicable here: overlayfs cannot be mounted for sessions on this host (the workspace is a copy)";
  }
  Bash(id, "echo v1 > state.txt");
  auto snap = manager_->Snapshot(id);  // a lower layer of the fork below
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  for (const std::string& s : {id, Create("", *snap)}) {
    Json r = Bash(s, "cat /proc/self/mountinfo; tr '\\0' ' ' < /proc/1/cmdline; echo");
    ASSERT_EQ(r["kind"], "exited") << r.dump();
    const std::string out = r["output"].get<std::string>();
    EXPECT_NE(out.find(" overlay "), std::string::npos) << out;
    EXPECT_EQ(out.find(state_), std::string::npos) << "the state directory shows inside:\n" << out;
    EXPECT_EQ(out.find(s), std::string::npos) << "the session id shows inside:\n" << out;
    EXPECT_EQ(out.find(*snap), std::string::npos) << "the snapshot id shows inside:\n" << out;
    EXPECT_EQ(out.find("upperdir=/"), std::string::npos) << out;
  }
}

TEST_F(WorldTest, SnapshotRestoreAndFork) {
  std::string id = Create();
  Bash(id, "echo v1 > state.txt; rm a.txt");
  auto snap = manager_->Snapshot(id);
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  Bash(id, "echo v2 > state.txt");
  std::string fork1 = Create("", *snap), fork2 = Create("", *snap);
  EXPECT_EQ(Bash(fork1, "cat state.txt; ls a.txt 2>&1 | grep -c 'No such'")["output"], "v1\n1\n");
  Bash(fork1, "echo f1 > state.txt");
  EXPECT_EQ(Bash(fork2, "cat state.txt")["output"], "v1\n");
  EXPECT_EQ(Bash(id, "cat state.txt")["output"], "v2\n");
  // A snapshot of a fork stacks on its parent.
  auto snap2 = manager_->Snapshot(fork1);
  ASSERT_TRUE(snap2.ok());
  std::string grandchild = Create("", *snap2);
  EXPECT_EQ(Bash(grandchild, "cat state.txt; test -e a.txt || echo gone")["output"], "f1\ngone\n");
  // The fork's diff against the base includes what the snapshot holds.
  auto diff = manager_->Diff(fork2);
  ASSERT_TRUE(diff.ok());
  std::string files = (*diff)["files"].dump();
  EXPECT_NE(files.find("state.txt"), std::string::npos) << files;
  EXPECT_NE(files.find("deleted"), std::string::npos) << files;
  // Unknown and corrupt snapshots are clear errors.
  CreateRequest bad;
  bad.workspace = base_;
  bad.from_snapshot = "snap-0000000000000000";
  auto missing = manager_->Create(bad);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().stage(), kNotFound);
  system(("for f in $(find " + state_ + "/snapshots/" + *snap + "/tree -type f); do echo corrupt >> $f; done").c_str());
  bad.from_snapshot = *snap;
  auto corrupt = manager_->Create(bad);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_NE(corrupt.status().message().find("corrupt"), std::string::npos) << corrupt.status().ToString();
}

TEST_F(WorldTest, ReplayReturnsTheRecordedResultWithoutRunningAgain) {
  std::string id = Create();
  auto first = manager_->Execute(id, "bash", {{"command", "echo x >> counter; wc -l < counter"}}, "call-1");
  ASSERT_TRUE(first.ok());
  EXPECT_EQ((*first)["output"], "1\n");
  auto again = manager_->Execute(id, "bash", {{"command", "echo x >> counter; wc -l < counter"}}, "call-1");
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)["replayed"].get<bool>());
  EXPECT_EQ((*again)["output"], "1\n");
  EXPECT_EQ(Bash(id, "wc -l < counter")["output"], "1\n");
  // After a restart too: the log is the record.
  Open();
  auto after = manager_->Execute(id, "bash", {{"command", "echo x >> counter; wc -l < counter"}}, "call-1");
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE((*after)["replayed"].get<bool>());
  // Another request under the same call_id is refused, not replayed.
  auto other = manager_->Execute(id, "bash", {{"command", "echo x >> counter"}}, "call-1");
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().stage(), kConflict);
  EXPECT_EQ(Bash(id, "wc -l < counter")["output"], "1\n");
}

TEST_F(WorldTest, AKilledProcessLeavesInterruptedCallsAndIntactSessions) {
  std::string id = Create();
  Bash(id, "echo kept > kept.txt");
  manager_.reset();
  // A process serving the session is killed mid-call.
  pid_t child = fork();
  if (child == 0) {
    ManagerOptions o;
    o.state_dir = state_;
    o.agentbox_exe = Bin();
    auto m = Manager::Open(o);
    if (!m.ok()) _exit(3);
    (void)(*m)->Execute(id, "bash", {{"command", "sleep 60"}}, "in-flight");
    _exit(0);
  }
  // Wait until the call is in the log, then SIGKILL.
  const std::string log = state_ + "/sessions/" + id + "/log.jsonl";
  for (int i = 0; i < 200 && Read(log).find("\"in-flight\"") == std::string::npos; ++i) usleep(25000);
  usleep(200000);
  kill(child, SIGKILL);
  int ws;
  waitpid(child, &ws, 0);
  // Its world dies with it (the channel closes); wait for the supervisor to go.
  for (int i = 0; i < 100 && system("pgrep -f 'agentbox __world' -u $(id -u) >/dev/null 2>&1") == 0; ++i) usleep(50000);
  Open();
  auto r = manager_->Execute(id, "bash", {{"command", "sleep 60"}}, "in-flight");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)["kind"], "interrupted") << r->dump();
  EXPECT_TRUE((*r)["replayed"].get<bool>());
  EXPECT_EQ(Bash(id, "cat kept.txt")["output"], "kept\n");
  EXPECT_NE(Read(log).find("\"interrupted\""), std::string::npos);
}

TEST_F(WorldTest, TimeoutsAreTimedOutAndTheWorldLivesOn) {
  std::string id = Create();
  Json r = Bash(id, "echo before; sleep 30", {{"timeout", 1}});
  EXPECT_EQ(r["kind"], "timed_out") << r.dump();
  EXPECT_EQ(r["output"].get<std::string>().rfind("timed_out after 1", 0), 0u) << r["output"];
  EXPECT_NE(r["output"].get<std::string>().find("before"), std::string::npos);
  EXPECT_EQ(Bash(id, "echo after")["output"], "after\n");
}

TEST_F(WorldTest, CancelEndsARunningCall) {
  std::string id = Create();
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    cancel = true;
  });
  auto started = std::chrono::steady_clock::now();
  auto r = manager_->Execute(id, "bash", {{"command", "sleep 300"}}, "", nullptr, &cancel);
  canceller.join();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)["kind"], "cancelled") << r->dump();
  // Only "never cancelled" (300 s) is ruled out; a loaded host gets a minute.
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(60));
}

TEST_F(WorldTest, OomKillIsNamedAndTheNextCallStillWorks) {
  std::string id = Create("resources:\n  memory_gib: { limit: 64Mi }\n");
  Json r = Bash(id, "python3 -c 'x = bytearray(512 * 1024 * 1024)'");
  // The host fact, checked without agentbox: a child cgroup with the memory controller.
  if (!host_facts::CgroupsExpected({"memory"})) {
    // Without one the limit cannot be enforced: the session refuses to run
    // (fail closed) and says why.
    EXPECT_EQ(r["kind"], "sandbox_error") << r.dump();
    EXPECT_NE(r["output"].get<std::string>().find("no writable cgroup"), std::string::npos) << r["output"];
    return;
  }
  EXPECT_EQ(r["kind"], "oom_killed") << r.dump();
  EXPECT_EQ(r["output"].get<std::string>().rfind("oom_killed at 64 MiB", 0), 0u) << r["output"];
  EXPECT_EQ(Bash(id, "echo alive")["output"], "alive\n");
}

// max_processes bounds the session's world: a pids cgroup where one is ours,
// else RLIMIT_NPROC in the world's own user namespace (both host facts
// checked without agentbox); a fork past it fails with EAGAIN.
TEST_F(WorldTest, MaxProcessesCapsTheWorld) {
  std::string id = Create("resources:\n  max_processes: 24\n");
  const std::string fork_until_refused =
      "python3 -c 'import os, errno, time\n"
      "made = err = 0\n"
      "pids = []\n"
      "for i in range(100):\n"
      "    try:\n"
      "        pid = os.fork()\n"
      "    except OSError as e:\n"
      "        err = e.errno\n"
      "        break\n"
      "    if pid == 0:\n"
      "        time.sleep(60)\n"
      "        os._exit(0)\n"
      "    pids.append(pid)\n"
      "    made += 1\n"
      "print(\"made=%d err=%s\" % (made, errno.errorcode.get(err, err)))\n"
      "for p in pids: os.kill(p, 9); os.waitpid(p, 0)'";  // what a call leaves running outlives it
  Json r = Bash(id, fork_until_refused);
  const bool cgroup = host_facts::CgroupsExpected({"pids"});
  if (!cgroup && !host_facts::NprocCapsUserNamespace()) {
    EXPECT_EQ(r["kind"], "sandbox_error") << r.dump();
    EXPECT_NE(r["output"].get<std::string>().find("max_processes"), std::string::npos) << r["output"];
    return;
  }
  ASSERT_EQ(r["kind"], "exited") << r.dump();
  const std::string out = r["output"].get<std::string>();
  EXPECT_NE(out.find("err=EAGAIN"), std::string::npos) << out;
  const auto at = out.find("made=");
  ASSERT_NE(at, std::string::npos) << out;
  EXPECT_LT(std::atoi(out.c_str() + at + 5), 24) << out;
  const Json& limits = r["outcome"]["usage"]["limits"];
  EXPECT_EQ(limits[cgroup ? "pids_max" : "nproc"], 24) << limits.dump();
  EXPECT_EQ(Bash(id, "echo alive")["output"], "alive\n");
}

// A call's report names the limits in force as `run`'s does, and they are
// the ones a command reads inside: core dumps off, the NOFILE soft limit,
// RLIMIT_FSIZE from disk_gib, the call's wall clock.
TEST_F(WorldTest, CallReportLimitsAreTheOnesInForceInside) {
  std::string id = Create("resources:\n  disk_gib: 1\n  wall_clock_min: 2\n");
  Json r = Bash(id, "echo core=$(ulimit -c) nofile=$(ulimit -n) fsize=$(ulimit -f)");
  ASSERT_EQ(r["kind"], "exited") << r.dump();
  const std::string out = r["output"].get<std::string>();
  const Json& usage = r["outcome"]["usage"];
  const Json& limits = usage["limits"];
  ASSERT_TRUE(limits.is_object()) << r.dump();
  ASSERT_TRUE(limits["core_dumps"].is_boolean()) << r.dump();
  EXPECT_EQ(out.find("core=0 ") != std::string::npos, !limits["core_dumps"].get<bool>()) << out << limits.dump();
  EXPECT_FALSE(limits["core_dumps"].get<bool>()) << limits.dump();
  ASSERT_TRUE(limits["nofile"].is_number_unsigned()) << limits.dump();
  EXPECT_NE(out.find("nofile=" + std::to_string(limits["nofile"].get<std::uint64_t>()) + " "), std::string::npos)
      << out << limits.dump();
  ASSERT_TRUE(limits["fsize_bytes"].is_number_unsigned()) << limits.dump();
  // `ulimit -f` counts 1024-byte blocks.
  EXPECT_NE(out.find("fsize=" + std::to_string(limits["fsize_bytes"].get<std::uint64_t>() / 1024)), std::string::npos)
      << out << limits.dump();
  EXPECT_EQ(limits["wall_clock_ms"], 120000) << limits.dump();
  // Usage as `run` reports it: from the command's rusage.
  EXPECT_TRUE(usage["peak_memory_bytes"].is_number_unsigned()) << usage.dump();
  EXPECT_GT(usage["peak_memory_bytes"].get<std::uint64_t>(), 0u) << usage.dump();
}

// A read_only entry absent on this host is skipped, and a call's report
// says so as `run`'s does.
TEST_F(WorldTest, CallReportNamesSkippedReadOnlyEntries) {
  const std::string absent = "/nonexistent-agentbox-" + std::to_string(getpid());
  struct stat st {};
  ASSERT_NE(stat(absent.c_str(), &st), 0) << absent << " exists on this host";
  std::string id = Create("filesystem:\n  read_only: [/usr, /bin, /sbin, /lib, /lib64, /etc, " + absent + "]\n");
  Json r = Bash(id, "echo ok");
  ASSERT_EQ(r["kind"], "exited") << r.dump();
  const Json& skipped = r["outcome"]["enforcement"]["skipped"];
  ASSERT_TRUE(skipped.is_array()) << r["outcome"]["enforcement"].dump();
  bool named = false;
  for (const auto& s : skipped) named = named || s.get<std::string>().find(absent) != std::string::npos;
  EXPECT_TRUE(named) << skipped.dump();
}

// A kernel whose Landlock gives less than the plan asks (here: a right no
// kernel knows), under require: partial: the world starts, and says what is
// short, for the calls' reports.
TEST_F(WorldTest, LandlockShortOfThePlanIsKeptForTheReports) {
  Policy policy = PresetFor(Mode::kWorkspaceWrite);
  policy.sandbox.require = Requirement::kPartial;
  HostCaps host = ProbeHostFor(policy);
  if (!host.user_namespaces || host.landlock_abi < 2) {
    GTEST_SKIP() << "not applicable here: sessions need user namespaces and this test Landlock (ABI "
                 << host.landlock_abi << ")";
  }
  Invocation inv;
  inv.workspace = base_;
  inv.cwd = base_;
  inv.home = "/nonexistent-home";
  inv.self_exe = Bin();
  inv.nonce = "0123456789abcdef";
  inv.session = true;
  auto confined = Confine({"true"}, policy, host, inv);
  ASSERT_TRUE(confined.ok()) << confined.status().ToString();
  Plan plan = confined->plan;
  plan.timeout_ms.reset();
  ASSERT_GT(plan.landlock.abi, 0);
  plan.landlock.handled_fs |= std::uint64_t{1} << 40;
  plan.landlock.required = false;
  auto world = World::Start(Bin(), plan, 10000);
  ASSERT_TRUE(world.ok()) << world.status().ToString();
  const auto& short_of = (*world)->short_of_plan();
  ASSERT_EQ(short_of.size(), 1u);
  EXPECT_EQ(short_of[0].facet, "filesystem");
  EXPECT_NE(short_of[0].reason.find("short of the plan"), std::string::npos) << short_of[0].reason;
  (*world)->Stop(0);
}

TEST_F(WorldTest, ADeadInitIsReprovisionedAndLogged) {
  std::string id = Create();
  Bash(id, "echo v > f.txt");
  // Nothing inside can kill pid 1 (it ignores what it does not handle), so
  // end the world from outside: its supervisor.
  Json d = *manager_->Describe(id);
  pid_t sup = d["sandbox_pid"].get<pid_t>();
  ASSERT_GT(sup, 0);
  kill(sup, SIGKILL);
  usleep(100000);
  Json r = Bash(id, "cat f.txt");
  EXPECT_EQ(r["output"], "v\n") << r.dump();  // the upper layer outlives the sandbox
  EXPECT_NE(Read(state_ + "/sessions/" + id + "/log.jsonl").find("\"reprovisioned\""), std::string::npos);
}

TEST_F(WorldTest, SeccompDenialsAreCountedPerCall) {
  std::string id = Create();
  Json r = Bash(id, "python3 -c 'import ctypes,sys; l=ctypes.CDLL(None); sys.exit(0 if l.mount(None,None,None,0,None)==0 else 3)'");
  EXPECT_EQ(r["kind"], "sandbox_denied") << r.dump();
  bool mount_denied = false;
  for (const auto& d : r["outcome"]["denials"]) mount_denied |= d.value("op", "") == "mount";
  EXPECT_TRUE(mount_denied) << r.dump();
  // The next call starts with a clean tally.
  Json clean = Bash(id, "exit 3");
  EXPECT_EQ(clean["kind"], "exited");
  EXPECT_TRUE(clean["outcome"]["denials"].empty()) << clean.dump();
}

TEST_F(WorldTest, NetworkDenialsNameTheHost) {
  std::string id = Create("network:\n  allow: [\"registry.example.test\"]\n");
  Json r = Bash(id, "curl -sS -o /dev/null --max-time 10 http://denied.example.test/ -w '%{http_code}\\n'; exit 7");
  EXPECT_EQ(r["kind"], "sandbox_denied") << r.dump();
  EXPECT_NE(r["output"].get<std::string>().find("denied.example.test:80"), std::string::npos) << r["output"];
}

// A host service's socket in the base workspace shows through the
// session's workspace; connecting to it is refused and named, while a
// listener the session makes itself in the same workspace is reachable.
TEST_F(WorldTest, HostSocketsInTheWorkspaceAreRefusedByPath) {
  int host = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  ASSERT_GE(host, 0);
  struct sockaddr_un a {};
  a.sun_family = AF_UNIX;
  const std::string path = base_ + "/host.sock";
  path.copy(a.sun_path, sizeof(a.sun_path) - 1);
  ASSERT_EQ(bind(host, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(host, 4), 0);
  std::string id = Create();
  Json own = Bash(id,
                  "python3 -c 'import socket, threading\n"
                  "s = socket.socket(socket.AF_UNIX); s.bind(\"own.sock\"); s.listen(1)\n"
                  "threading.Thread(target=lambda: s.accept()[0].sendall(b\"own-ok\")).start()\n"
                  "c = socket.socket(socket.AF_UNIX); c.connect(\"own.sock\"); print(c.recv(8).decode())'");
  EXPECT_EQ(own["kind"], "exited") << own.dump();
  EXPECT_NE(own["output"].get<std::string>().find("own-ok"), std::string::npos) << own.dump();
  Json r = Bash(id, "python3 -c 'import socket; socket.socket(socket.AF_UNIX).connect(\"host.sock\")'");
  EXPECT_EQ(r["kind"], "sandbox_denied") << r.dump();
  EXPECT_NE(r["output"].get<std::string>().find("connect host.sock"), std::string::npos) << r["output"];
  bool named = false;
  for (const auto& d : r["outcome"]["denials"]) {
    named |= d.value("op", "") == "connect" && d.value("target", "") == "host.sock";
  }
  EXPECT_TRUE(named) << r.dump();
  EXPECT_LT(accept4(host, nullptr, nullptr, SOCK_CLOEXEC), 0) << "a connection reached the host's listener";
  close(host);
  unlink(path.c_str());
}

TEST_F(WorldTest, LongOutputIsCappedWithAMarker) {
  std::string id = Create();
  Json r = Bash(id, "seq 1 100000");
  EXPECT_TRUE(r["truncated"].get<bool>());
  const std::string out = r["output"];
  EXPECT_LT(out.size(), 70u * 1024);
  EXPECT_NE(out.find("output truncated"), std::string::npos);
  EXPECT_EQ(out.substr(0, 2), "1\n");
  EXPECT_NE(out.find("100000\n"), std::string::npos);  // the tail is kept
}

TEST_F(WorldTest, BadRequestsAreRefusedWithoutRunning) {
  std::string id = Create();
  auto unknown = manager_->Execute(id, "rm_rf", Json::object());
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().stage(), kBadRequest);
  EXPECT_NE(unknown.status().message().find("bash"), std::string::npos);
  auto missing = manager_->Execute(id, "bash", Json::object());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("command"), std::string::npos);
  auto nosession = manager_->Execute("s-nope", "bash", {{"command", "true"}});
  ASSERT_FALSE(nosession.ok());
  EXPECT_EQ(nosession.status().stage(), kNotFound);
  EXPECT_TRUE(Children().empty()) << "a refused call provisioned a sandbox";
}

TEST_F(WorldTest, CopyModeWhereOverlayIsNotWanted) {
  Open("copy");
  std::string id = Create();
  EXPECT_EQ((*manager_->Describe(id))["mode"], "copy");
  Bash(id, "echo changed > a.txt");
  EXPECT_EQ(Read(base_ + "/a.txt"), "base\n");
  auto diff = manager_->Diff(id);
  ASSERT_TRUE(diff.ok());
  EXPECT_NE((*diff)["patch"].get<std::string>().find("+changed"), std::string::npos) << diff->dump();
}

// disk_gib bounds what a session writes to its workspace: its upper layer
// lives on a filesystem of that size. A 2 GiB fill (files under the
// per-file RLIMIT_FSIZE, so that only the workspace's size can stop it) under
// disk_gib: 1 ends in ENOSPC, the call's report is a resources denial naming
// disk_gib, and nothing written before the limit is lost.
TEST_F(WorldTest, DiskGibBoundsWhatASessionWritesToItsWorkspace) {
  std::string id = Create("resources:\n  disk_gib: 1\n");
  ASSERT_EQ(Tool(id, "write_file", {{"path", "before.txt"}, {"content", "written before\n"}})["kind"], "ok");
  Json pwd = Bash(id, "echo changed > a.txt; pwd");
  ASSERT_EQ(pwd["kind"], "exited");
  const std::string inside = pwd["output"].get<std::string>().substr(0, pwd["output"].get<std::string>().size() - 1);
  Json r = Bash(id, "mkdir fill && for i in $(seq 1 16); do "
                    "dd if=/dev/zero of=fill/$i bs=1M count=128 status=none || exit 1; done; echo all written");
  const std::string out = r["output"].get<std::string>();
  EXPECT_NE(out.find("No space left on device"), std::string::npos) << r.dump();
  EXPECT_EQ(out.find("all written"), std::string::npos) << r.dump();
  EXPECT_EQ(r["kind"], "sandbox_denied") << r.dump();
  bool named = false;
  for (const auto& d : r["outcome"]["denials"]) {
    if (d["facet"] == "resources" && d["op"] == "write" &&
        d["reason"].get<std::string>().find("disk_gib") != std::string::npos &&
        d["reason"].get<std::string>().find("ENOSPC") != std::string::npos) {
      named = true;
      EXPECT_TRUE(d["source"] == "statfs" || d["source"] == "stderr-signature") << d.dump();
      EXPECT_EQ(d["target"].get<std::string>().rfind(inside, 0), 0u) << d.dump() << " " << inside;
    }
  }
  EXPECT_TRUE(named) << r["outcome"].dump();
  EXPECT_EQ(r["output"].get<std::string>().rfind("sandbox_denied: write ", 0), 0u) << r["output"];
  // The enforcement report names the mechanism.
  bool mechanism = false;
  for (const auto& m : r["outcome"]["enforcement"]["facets"]["resources"]["mechanisms"]) {
    mechanism = mechanism || m == "upper-tmpfs-size";
  }
  EXPECT_TRUE(mechanism) << r["outcome"]["enforcement"].dump();
  // What the workspace holds is bounded by the cap (the host's disk got none of it).
  Json du = Bash(id, "du -sb --apparent-size fill | cut -f1");
  ASSERT_EQ(du["kind"], "exited") << du.dump();
  EXPECT_LE(std::stoull(du["output"].get<std::string>()), std::uint64_t{1} << 30) << du.dump();
  // A file tool's write past the cap is the same denial, naming its file.
  Json w = Tool(id, "write_file", {{"path", "after.txt"}, {"content", std::string(1 << 20, 'x')}});
  EXPECT_EQ(w["kind"], "sandbox_denied") << w.dump();
  ASSERT_TRUE(w["outcome"]["denials"].is_array()) << w.dump();
  EXPECT_EQ(w["outcome"]["denials"][0]["facet"], "resources") << w.dump();
  EXPECT_NE(w["outcome"]["denials"][0]["reason"].get<std::string>().find("disk_gib"), std::string::npos) << w.dump();
  // Nothing written before the limit is lost: through the API and the diff.
  EXPECT_EQ(Tool(id, "read_file", {{"path", "before.txt"}})["output"], "written before\n");
  EXPECT_EQ(Bash(id, "cat a.txt; stat -c %s fill/1")["output"], "changed\n134217728\n");
  auto diff = manager_->Diff(id);
  ASSERT_TRUE(diff.ok()) << diff.status().ToString();
  bool before_listed = false;
  for (const auto& f : (*diff)["files"]) before_listed = before_listed || f["path"] == "before.txt";
  EXPECT_TRUE(before_listed) << (*diff)["files"].dump();
  EXPECT_NE((*diff)["patch"].get<std::string>().find("+changed"), std::string::npos);
  // Space freed is space again.
  EXPECT_EQ(Bash(id, "rm -r fill && echo again > after.txt && cat after.txt")["output"], "again\n");
  EXPECT_EQ(Read(base_ + "/a.txt"), "base\n");
}

// The capped upper layer outlives its world: a world that dies takes
// nothing of the workspace with it, and snapshots see it.
TEST_F(WorldTest, ACappedUpperLayerOutlivesItsWorld) {
  std::string id = Create("resources:\n  disk_gib: 0.25\n");
  ASSERT_EQ(Bash(id, "echo kept > k.txt; rm a.txt; mkdir -p d && echo x > d/x")["kind"], "exited");
  Json d = *manager_->Describe(id);
  EXPECT_EQ(d["upper_fs"], "tmpfs") << d.dump();
  pid_t sup = d["sandbox_pid"].get<pid_t>();
  ASSERT_GT(sup, 0);
  kill(sup, SIGKILL);
  usleep(100000);
  // Diff while no world runs, then the next world: the same upper layer.
  auto diff = manager_->Diff(id);
  ASSERT_TRUE(diff.ok()) << diff.status().ToString();
  EXPECT_NE((*diff)["patch"].get<std::string>().find("+kept"), std::string::npos) << diff->dump();
  Json r = Bash(id, "cat k.txt d/x; ls a.txt 2>&1 | grep -c 'No such'");
  EXPECT_EQ(r["output"], "kept\nx\n1\n") << r.dump();
  EXPECT_NE(Read(state_ + "/sessions/" + id + "/log.jsonl").find("\"reprovisioned\""), std::string::npos);
  // Still capped in the new world.
  Json fill = Bash(id, "for i in 1 2 3; do dd if=/dev/zero of=big$i bs=1M count=150 status=none || exit 1; done");
  EXPECT_EQ(fill["kind"], "sandbox_denied") << fill.dump();
  auto snap = manager_->Snapshot(id);
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  std::string child = Create("", *snap);
  EXPECT_EQ(Bash(child, "cat k.txt; test -e a.txt || echo gone")["output"], "kept\ngone\n");
}

// A graceful stop of the serving process writes the capped upper layer to
// the state directory (at most disk_gib of it); the next process starts the
// session's next world with it.
TEST_F(WorldTest, ACappedUpperLayerIsKeptAcrossAGracefulRestart) {
  std::string id = Create("resources:\n  disk_gib: 0.25\n");
  ASSERT_EQ(Bash(id, "echo kept > k.txt; rm a.txt")["kind"], "exited");
  Open();  // the Manager shuts down (its worlds stop) and a new one opens the state directory
  Json d = *manager_->Describe(id);
  EXPECT_FALSE(d.contains("upper_lost")) << d.dump();
  auto diff = manager_->Diff(id);  // before any world of the new process
  ASSERT_TRUE(diff.ok()) << diff.status().ToString();
  EXPECT_NE((*diff)["patch"].get<std::string>().find("+kept"), std::string::npos) << diff->dump();
  EXPECT_NE((*diff)["patch"].get<std::string>().find("deleted file mode"), std::string::npos) << diff->dump();
  EXPECT_EQ(Bash(id, "cat k.txt; test -e a.txt || echo gone")["output"], "kept\ngone\n");
  Json fill = Bash(id, "for i in 1 2 3; do dd if=/dev/zero of=big$i bs=1M count=150 status=none || exit 1; done");
  EXPECT_EQ(fill["kind"], "sandbox_denied") << fill.dump();
}

// A process that ends without stopping (killed) takes the capped upper
// layer with it: the next one says so, in the log and in Describe.
TEST_F(WorldTest, AKilledProcessTakesACappedUpperLayerWithItAndSaysSo) {
  std::string id = Create("resources:\n  disk_gib: 0.25\n");
  manager_.reset();
  pid_t child = fork();
  if (child == 0) {
    ManagerOptions o;
    o.state_dir = state_;
    o.agentbox_exe = Bin();
    auto m = Manager::Open(o);
    if (!m.ok()) _exit(3);
    auto r = (*m)->Execute(id, "bash", {{"command", "echo x > lost.txt"}});
    _exit(r.ok() && (*r)["kind"] == "exited" ? 0 : 4);  // no Shutdown: as if killed
  }
  int ws = 0;
  ASSERT_EQ(waitpid(child, &ws, 0), child);
  ASSERT_TRUE(WIFEXITED(ws));
  ASSERT_EQ(WEXITSTATUS(ws), 0);
  for (int i = 0; i < 100 && system("pgrep -f 'agentbox __world' -u $(id -u) >/dev/null 2>&1") == 0; ++i) usleep(50000);
  Open();
  Json d = *manager_->Describe(id);
  EXPECT_EQ(d["upper_lost"], true) << d.dump();
  EXPECT_NE(Read(state_ + "/sessions/" + id + "/log.jsonl").find("\"upper_lost\""), std::string::npos);
  EXPECT_EQ(Bash(id, "test -e lost.txt || echo gone; cat a.txt")["output"], "gone\nbase\n");
}

// The capped upper layer is memory: what the session writes there counts
// toward its memory limit, which a fill meets first when it is the smaller.
// A session's world has the supervisor's DNS and the connect() broker too:
// a name nothing allows is refused when it is looked up, and the call's
// report names it; a literal address is refused at connect().
TEST_F(WorldTest, TheWorldsDnsAndConnectsAreDecidedAndNamed) {
  std::string id = Create("");
  Json r = Bash(id, "getent hosts registry.example; echo getent=$?; "
                    "python3 -c 'import socket\ntry:\n  socket.create_connection((\"192.0.2.1\", 80), 5)\n"
                    "except OSError as e: print(\"errno\", e.errno)'; exit 3");
  const std::string out = r["output"].get<std::string>();
  EXPECT_NE(out.find("getent=2"), std::string::npos) << r.dump();
  EXPECT_NE(out.find("errno 111"), std::string::npos) << r.dump();
  EXPECT_EQ(r["kind"], "sandbox_denied") << r.dump();
  bool dns = false, connect = false;
  for (const auto& d : r["outcome"]["denials"]) {
    dns = dns || (d["facet"] == "network" && d["op"] == "dns" && d["target"] == "registry.example" &&
                  d["reason"].get<std::string>().find("networking is off by policy") != std::string::npos);
    connect = connect || (d["facet"] == "network" && d["op"] == "connect" && d["target"] == "192.0.2.1:80");
  }
  EXPECT_TRUE(dns) << r["outcome"].dump();
  EXPECT_TRUE(connect) << r["outcome"].dump();
}

// What the kernel's OOM killer takes first in a session's cgroup: a call's
// processes (its keeper and what it starts score 1000), not the world's
// init (pid 1 of the world's namespace only, which the kernel does not
// exempt; it keeps 0).
TEST_F(WorldTest, TheOomKillerPrefersACallsProcessesToTheWorldsInit) {
  std::string id = Create("");
  Json r = Bash(id, "cat /proc/self/oom_score_adj /proc/1/oom_score_adj");
  EXPECT_EQ(r["output"], "1000\n0\n") << r.dump();
}

TEST_F(WorldTest, ACappedUpperLayerCountsTowardTheSessionsMemory) {
  std::string id = Create("resources:\n  memory_gib: { limit: 128Mi }\n  disk_gib: 1\n");
  Json r = Bash(id, "echo small > s.txt; for i in 1 2 3 4; do dd if=/dev/zero of=f$i bs=1M count=100 status=none || exit 1; done");
  if (!host_facts::CgroupsExpected({"memory"})) {
    EXPECT_EQ(r["kind"], "sandbox_error") << r.dump();  // fail closed: no memory limit without a cgroup
    return;
  }
  EXPECT_EQ(r["kind"], "oom_killed") << r.dump();
  // At the limit, each call that starts a process meets the OOM killer,
  // which takes the call's processes and never the world's init.
  for (int i = 0; i < 6; ++i) {
    Json at_limit = Bash(id, "true");
    EXPECT_TRUE(at_limit["kind"] == "exited" || at_limit["kind"] == "oom_killed") << at_limit.dump();
  }
  // The session stays usable: removing files gives the memory back, and
  // what was written before is there. The call that removes them starts
  // with the session's memory still at its limit, so starting its processes
  // may itself cost an OOM kill (and is then reported as one); the call
  // after it must run clean.
  Json removed = Bash(id, "rm -f f*");
  EXPECT_TRUE(removed["kind"] == "exited" || removed["kind"] == "oom_killed") << removed.dump();
  Json after = Bash(id, "cat s.txt; ls f* 2>/dev/null | wc -l");
  EXPECT_EQ(after["kind"], "exited") << after.dump();
  EXPECT_EQ(after["output"], "small\n0\n") << after.dump();
}

// A copy-mode session's workspace is a copy on the host's disk: disk_gib
// cannot bound it, so it is missing, and require: full refuses (fail closed).
TEST_F(WorldTest, DiskGibInCopyModeIsMissingAndRefusedUnderRequireFull) {
  Open("copy");
  std::string id = Create("resources:\n  disk_gib: 1\n");
  Json r = Bash(id, "echo ran");
  EXPECT_EQ(r["kind"], "sandbox_error") << r.dump();
  EXPECT_NE(r["output"].get<std::string>().find("disk_gib: the session's copy of the workspace"), std::string::npos)
      << r["output"];
  std::string partial = Create("sandbox:\n  require: partial\nresources:\n  disk_gib: 1\n");
  Json p = Bash(partial, "echo ran");
  ASSERT_EQ(p["kind"], "exited") << p.dump();
  bool named = false;
  for (const auto& m : p["outcome"]["enforcement"]["missing"]) {
    named = named || (m["facet"] == "resources" && m["reason"].get<std::string>().find("disk_gib") != std::string::npos);
  }
  EXPECT_TRUE(named) << p["outcome"]["enforcement"].dump();
  EXPECT_EQ(p["outcome"]["enforcement"]["facets"]["resources"]["level"], "partial");
}

// As root, the upper layer can be an ext4 image loop-mounted under the
// state directory instead of memory: capped the same, kept across a
// restart of the process, and no mount left after it stops or the session
// is removed.
TEST_F(WorldTest, DiskGibOnALoopImageAsRoot) {
  if (geteuid() != 0 || access("/dev/loop-control", W_OK) != 0) {
    GTEST_SKIP() << "not applicable here: loop-mounting an image needs root and /dev/loop-control";
  }
  manager_.reset();
  ManagerOptions o;
  o.state_dir = state_;
  o.agentbox_exe = Bin();
  o.upper_fs = "image";
  auto m = Manager::Open(o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  manager_ = std::move(*m);
  std::string id = Create("resources:\n  disk_gib: 0.25\n");
  EXPECT_EQ((*manager_->Describe(id))["upper_fs"], "image");
  ASSERT_EQ(Bash(id, "echo kept > k.txt")["kind"], "exited");
  Json r = Bash(id, "for i in 1 2 3; do dd if=/dev/zero of=big$i bs=1M count=150 status=none || exit 1; done");
  EXPECT_EQ(r["kind"], "sandbox_denied") << r.dump();
  ASSERT_TRUE(r["outcome"]["denials"].is_array() && !r["outcome"]["denials"].empty()) << r.dump();
  EXPECT_EQ(r["outcome"]["denials"][0]["facet"], "resources") << r.dump();
  bool mechanism = false;
  for (const auto& mech : r["outcome"]["enforcement"]["facets"]["resources"]["mechanisms"]) {
    mechanism = mechanism || mech == "upper-loop-image";
  }
  EXPECT_TRUE(mechanism) << r["outcome"]["enforcement"].dump();
  Bash(id, "rm -f big*");
  manager_.reset();  // stops: the image is unmounted, and stays
  EXPECT_EQ(Read("/proc/self/mountinfo").find(state_), std::string::npos) << "a mount under the state directory";
  m = Manager::Open(o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  manager_ = std::move(*m);
  auto diff = manager_->Diff(id);
  ASSERT_TRUE(diff.ok()) << diff.status().ToString();
  EXPECT_NE((*diff)["patch"].get<std::string>().find("+kept"), std::string::npos) << diff->dump();
  EXPECT_EQ(Bash(id, "cat k.txt")["output"], "kept\n");
  ASSERT_TRUE(manager_->Remove(id).ok());
  EXPECT_EQ(Read("/proc/self/mountinfo").find(state_), std::string::npos) << "a mount under the state directory";
}

TEST_F(WorldTest, RemoveLeavesNothingBehind) {
  std::string id = Create();
  Bash(id, "sleep 60 >/dev/null 2>&1 &");
  ASSERT_TRUE(manager_->Remove(id).ok());
  struct stat st {};
  EXPECT_NE(stat((state_ + "/sessions/" + id).c_str(), &st), 0);
  EXPECT_TRUE(Children().empty());
  EXPECT_FALSE(manager_->Describe(id).ok());
}

TEST_F(WorldTest, ConcurrentCallsInOneSession) {
  std::string id = Create();
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      auto r = manager_->Execute(id, "bash", {{"command", "sleep 0.2; echo " + std::to_string(i)}});
      if (r.ok() && (*r)["output"] == std::to_string(i) + "\n") ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 8);
}

}  // namespace
}  // namespace agentbox::session

namespace agentbox::session {
namespace {

TEST_F(WorldTest, CommandsCannotReachTheInitOrItsChannels) {
  std::string id = Create();
  // The init is not dumpable: its fds (the control socket among them), its
  // memory and its environment are out of reach of the session's commands.
  Json r = Bash(id, "ls /proc/1/fd 2>&1; cat /proc/1/environ 2>&1 | head -c 100; echo; "
                    "ls -l /proc/self/fd | grep -c socket; true");
  const std::string out = r["output"];
  EXPECT_NE(out.find("Permission denied"), std::string::npos) << out;
  EXPECT_EQ(out.find("AGENTBOX_PLAN"), std::string::npos) << out;
  EXPECT_EQ(out.substr(out.size() - 2), "0\n") << "a command inherited a socket: " << out;
  // Signals to pid 1 from inside do nothing; the world keeps serving.
  Bash(id, "kill -9 1; kill -TERM 1; true");
  EXPECT_EQ(Bash(id, "echo still")["output"], "still\n");
  // A file tool runs as a forked copy of the init: not traceable either.
  Json t = Bash(id, "python3 - <<'PY'\nimport ctypes\nl = ctypes.CDLL(None)\nprint(l.ptrace(16, 1, 0, 0))\nPY");
  EXPECT_NE(t["output"].get<std::string>().find("-1"), std::string::npos) << t.dump();
}

TEST_F(WorldTest, SnapshotOnExitIsHonouredOnRemove) {
  std::string id = Create("sandbox:\n  snapshot_on_exit: true\n");
  Bash(id, "echo last > final.txt");
  ASSERT_TRUE(manager_->Remove(id).ok());
  // The snapshot is there, whole, and a new session starts from it.
  std::string snap;
  if (DIR* d = opendir((state_ + "/snapshots").c_str())) {
    while (struct dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') snap = e->d_name;
    }
    closedir(d);
  }
  ASSERT_FALSE(snap.empty());
  std::string next = Create("", snap);
  EXPECT_EQ(Bash(next, "cat final.txt")["output"], "last\n");
}

TEST_F(WorldTest, FreshPerTaskFalseWorksOnTheWorkspaceItself) {
  std::string id = Create("sandbox:\n  fresh_per_task: false\n");
  EXPECT_EQ((*manager_->Describe(id))["mode"], "direct");
  Bash(id, "echo direct > direct.txt");
  EXPECT_EQ(Read(base_ + "/direct.txt"), "direct\n");
  auto diff = manager_->Diff(id);
  ASSERT_FALSE(diff.ok());
  EXPECT_NE(diff.status().message().find("fresh_per_task"), std::string::npos);
}

// In direct mode a call writes the base itself: a repository it creates
// there is audited after the call, as `agentbox run` does at its end.
TEST_F(WorldTest, DirectModeAuditsRepositoriesACallCreates) {
  ASSERT_EQ(0, system(("git -C " + base_ + " init -q old 2>/dev/null").c_str()));
  std::string id = Create("sandbox:\n  fresh_per_task: false\n");
  Json r = Bash(id, "git init -q fresh && printf '#!/bin/sh\\n' > fresh/.git/hooks/pre-commit && "
                    "chmod +x fresh/.git/hooks/pre-commit && echo x > old/.git/hooks/pre-commit; echo done");
  EXPECT_EQ(r.value("kind", ""), "sandbox_denied") << r.dump();
  bool hook = false;
  for (const auto& d : r["outcome"]["denials"]) {
    if (d.value("op", "") == "git-hook" && d.value("target", "").find("fresh/.git/hooks/pre-commit") != std::string::npos) {
      hook = true;
    }
  }
  EXPECT_TRUE(hook) << r.dump();
  EXPECT_FALSE(std::filesystem::exists(base_ + "/fresh/.git/hooks/pre-commit"));
  EXPECT_TRUE(std::filesystem::exists(base_ + "/fresh/.git/hooks/pre-commit.agentbox-quarantine"));
  EXPECT_FALSE(std::filesystem::exists(base_ + "/old/.git/hooks/pre-commit")) << "a repository there at the start is protected";
  Json config = Tool(id, "write_file", {{"path", "fresh/.git/config"}, {"content", "[core]\n\thooksPath = /tmp\n"}});
  EXPECT_EQ(config.value("kind", ""), "sandbox_denied") << config.dump();
  EXPECT_TRUE(std::filesystem::exists(base_ + "/fresh/.git/config.agentbox-quarantine")) << config.dump();
  Json clean = Bash(id, "echo fine");
  EXPECT_EQ(clean.value("kind", ""), "exited") << "what is quarantined is not reported again: " << clean.dump();
}

}  // namespace
}  // namespace agentbox::session

namespace agentbox::session {
namespace {

// A file tool is agentbox's own code forked from the init: it must hold no
// descriptor of the init's that a path like /proc/self/fd/N could reopen
// (the caller's stdout/stderr above all).
TEST_F(WorldTest, FileToolsHoldNoDescriptorOfTheCallers) {
  // The world's processes inherit this process's stderr: point it at a file.
  const std::string err_path = state_ + "/stderr.txt";
  int saved = dup(2);
  int file = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(file, 0);
  dup2(file, 2);
  close(file);
  std::string id = Create();
  Json list = Tool(id, "list_dir", {{"path", "/proc/self/fd"}});
  for (const char* fd : {"1", "2"}) {
    (void)Tool(id, "write_file", {{"path", std::string("/proc/self/fd/") + fd}, {"content", "INJECTED\n"}});
    (void)Tool(id, "edit_file", {{"path", std::string("/proc/self/fd/") + fd}, {"old", "a"}, {"new", "INJECTED"}});
  }
  dup2(saved, 2);
  close(saved);
  EXPECT_EQ(Read(err_path).find("INJECTED"), std::string::npos) << Read(err_path);
  // 0-2 are /dev/null, 3 is the answer's pipe (plus the fd list_dir reads with).
  std::size_t entries = 0;
  for (const auto& e : list["outcome"].value("entries", Json::array())) {
    (void)e;
    ++entries;
  }
  EXPECT_LE(entries, 5u) << list.dump();
}

// Nothing of the caller's (the daemon's) environment reaches a session: not
// its commands, not its file tools, not /proc/*/environ or cmdline of any
// process a session can see, and the plan is not an environment variable.
TEST_F(WorldTest, TheCallersEnvironmentReachesNoSessionProcess) {
  const std::string secret = "agentbox-planted-" + std::to_string(getpid()) + "-Zq7xKw";
  // Set while the world starts (at its first call) and runs.
  ASSERT_EQ(0, setenv("AGENTBOX_TEST_PLANTED_SECRET", secret.c_str(), 1));
  struct Unset {
    ~Unset() { unsetenv("AGENTBOX_TEST_PLANTED_SECRET"); }
  } unset;
  std::string id = Create();
  ASSERT_EQ(0, symlink("/proc/self/environ", (base_ + "/env-link").c_str()));
  std::vector<Json> answers;
  answers.push_back(Bash(id, "env; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline /proc/self/environ; do "
                             "echo \"== $f\"; tr '\\0' '\\n' < $f 2>&1; done; true"));
  for (const std::string path : {"/proc/self/environ", "/proc/1/environ", "env-link", "/proc/self/cmdline"}) {
    SCOPED_TRACE(path);
    Json r = Tool(id, "read_file", {{"path", path}});
    EXPECT_EQ(r["kind"], "tool_error") << r.dump();
    answers.push_back(r);
    // edit_file was an oracle: "not found" for a wrong guess, a write denial for a right one.
    Json right = Tool(id, "edit_file", {{"path", path}, {"old", "AGENTBOX_TEST_PLANTED_SECRET="}, {"new", "x"}});
    Json wrong = Tool(id, "edit_file", {{"path", path}, {"old", "NO_SUCH_VARIABLE_ANYWHERE="}, {"new", "x"}});
    EXPECT_EQ(right["kind"], "tool_error") << right.dump();
    EXPECT_EQ(right["output"], wrong["output"]) << "a right guess answers differently from a wrong one";
    EXPECT_EQ(right["output"].get<std::string>().find("not found"), std::string::npos) << right.dump();
    EXPECT_EQ(wrong["output"].get<std::string>().find("not found"), std::string::npos) << wrong.dump();
    answers.push_back(right);
    answers.push_back(wrong);
    Json w = Tool(id, "write_file", {{"path", path}, {"content", "x"}});
    EXPECT_EQ(w["kind"], "tool_error") << w.dump();
    answers.push_back(w);
  }
  for (const std::string path : {"/proc/self", "/proc", "/sys/kernel"}) {
    Json l = Tool(id, "list_dir", {{"path", path}});
    EXPECT_EQ(l["kind"], "tool_error") << l.dump();
    answers.push_back(l);
  }
  answers.push_back(Tool(id, "glob", {{"pattern", "/proc/self/*"}}));
  answers.push_back(Tool(id, "glob", {{"pattern", "/proc/*/environ"}}));
  for (const Json& a : answers) {
    const std::string text = a.dump();
    EXPECT_EQ(text.find(secret), std::string::npos) << text;
    EXPECT_EQ(text.find("AGENTBOX_PLAN"), std::string::npos) << text;
  }
  const std::string bash_out = answers.front()["output"];
  EXPECT_NE(bash_out.find("== /proc/self/environ"), std::string::npos) << bash_out;
  EXPECT_NE(bash_out.find("PATH="), std::string::npos) << "the policy's env.pass must still reach commands: " << bash_out;
}

// A timed-out call's processes end with it: a double-forked child that
// ignores SIGTERM and left the call's session, and a stopped process group,
// do not survive it. What a call that finished by itself left running does
// (services_test.cc has the rest).
TEST_F(WorldTest, ACallsProcessesEndWithATimedOutCall) {
  std::string id = Create();
  Json r = Bash(id,
                "(trap '' TERM; setsid sh -c 'trap \"\" TERM; exec sleep 1000' & ) ; "
                "setsid sh -c 'kill -STOP $$; sleep 1001' & "
                "sleep 1002 & sleep 30",
                {{"timeout", 1}});
  EXPECT_EQ(r["kind"], "timed_out") << r.dump();
  Json finished = Bash(id, "sleep 1003 & (setsid sleep 1004 &); echo done");
  EXPECT_EQ(finished["output"], "done\n") << finished.dump();
  Json ps = Bash(id, "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done");
  const std::string out = ps["output"];
  EXPECT_NE(out.find("for p in"), std::string::npos) << out;
  for (const char* left : {"sleep 1000", "sleep 1001", "sleep 1002"}) {
    EXPECT_EQ(out.find(left), std::string::npos) << left << " survived its timed-out call:\n" << out;
  }
  for (const char* kept : {"sleep 1003", "sleep 1004"}) {
    EXPECT_NE(out.find(kept), std::string::npos) << kept << " did not outlive the call that finished:\n" << out;
  }
}

using host_facts::LandlockAbi;

// A session's processes cannot stop a file tool (whose call would then
// hang) nor the process that ends their own call when it ends.
TEST_F(WorldTest, CommandsCannotStopFileToolsOrTheirCallsKeeper) {
  if (LandlockAbi() < 6) GTEST_SKIP() << "not applicable here: Landlock ABI " << LandlockAbi() << " has no signal scope";
  std::string id = Create();
  Json parent = Bash(id, "kill -STOP $PPID; echo rc=$?");
  EXPECT_NE(parent["output"].get<std::string>().find("rc=1"), std::string::npos) << parent.dump();
  std::atomic<bool> done{false};
  std::thread stopper([&] {
    Bash(id, "end=$((SECONDS+4)); while [ $SECONDS -lt $end ]; do for p in /proc/[0-9]*; do "
             "read -r c < $p/comm 2>/dev/null; [ \"$c\" = agentbox-init ] && kill -STOP ${p#/proc/} 2>/dev/null; "
             "done; done; true");
    done = true;
  });
  int calls = 0;
  while (!done) {
    Json r = Tool(id, "read_file", {{"path", "a.txt"}});
    EXPECT_EQ(r["kind"], "ok") << r.dump();
    ++calls;
  }
  stopper.join();
  EXPECT_GT(calls, 0);
  EXPECT_EQ(Bash(id, "echo alive")["output"], "alive\n");
}

// A tree that fits under PATH_MAX inside the session but not under the
// longer host path of its layer: diff and snapshot work or name the problem.
TEST_F(WorldTest, DiffAndSnapshotOfATreeDeeperThanTheHostPathAllows) {
  std::string id = Create();
  const std::string pwd = Bash(id, "pwd")["output"];
  ASSERT_FALSE(pwd.empty());
  // Nested 200-byte names up to 4080 bytes of path inside.
  const std::size_t inside = pwd.size() - 1;
  const std::size_t depth = (4080 - inside) / 201;
  const std::size_t last = 4080 - inside - depth * 201 - 1;
  Json made = Bash(id, "d=$(printf 'd%.0s' $(seq 200)); for i in $(seq " + std::to_string(depth) +
                           "); do mkdir $d && cd $d || exit 1; done; l=$(printf 'e%.0s' $(seq " + std::to_string(last) +
                           ")); echo deep > $l && echo made ${#PWD}");
  ASSERT_NE(made["output"].get<std::string>().find("made"), std::string::npos) << made.dump();
  auto diff = manager_->Diff(id);
  if (!diff.ok()) {
    EXPECT_EQ(diff.status().stage(), "path_too_long") << diff.status().ToString();
  } else {
    EXPECT_NE((*diff)["patch"].get<std::string>().find("+deep"), std::string::npos);
  }
  auto snap = manager_->Snapshot(id);
  if (!snap.ok()) {
    EXPECT_EQ(snap.status().stage(), "path_too_long") << snap.status().ToString();
  }
  EXPECT_EQ(Bash(id, "echo alive")["output"], "alive\n");
}

// A file tool's temporary name stays short whatever the target's length.
TEST_F(WorldTest, WriteFileCreatesNamesUpToTheFilesystemsLimit) {
  std::string id = Create();
  const std::string name(250, 'n');
  Json w = Tool(id, "write_file", {{"path", name}, {"content", "long\n"}});
  EXPECT_EQ(w["kind"], "ok") << w.dump();
  EXPECT_EQ(Bash(id, "cat " + name)["output"], "long\n");
  Json again = Tool(id, "write_file", {{"path", name}, {"content", "again\n"}});
  EXPECT_EQ(again["kind"], "ok") << again.dump();
  EXPECT_EQ(Bash(id, "cat " + name + "; ls -a | grep -c agentbox; true")["output"], "again\n0\n");
}

// A snapshot that cannot be taken never leaves a session half-removed.
TEST_F(WorldTest, ARemovalThatCannotSnapshotKeepsAUsableSession) {
  std::string id = Create("sandbox:\n  snapshot_on_exit: true\n");
  Bash(id, "touch \"x$(printf '\\303')\"; echo ok > plain.txt");
  Status removed = manager_->Remove(id);
  if (!removed.ok()) {
    EXPECT_EQ(removed.stage(), kConflict) << removed.ToString();
    EXPECT_EQ(Bash(id, "rm -f x*; echo still")["output"], "still\n");
    ASSERT_TRUE(manager_->Remove(id).ok());
  }
  EXPECT_FALSE(manager_->Describe(id).ok());
  EXPECT_TRUE(Children().empty());
}

}  // namespace
}  // namespace agentbox::session
