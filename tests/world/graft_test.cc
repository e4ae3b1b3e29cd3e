// Grants applied to a running world: host paths grafted into its mount
// namespace (and taken out again), Landlock's part in that, and its memory
// limit changed in place. Real worlds, as root and unprivileged.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agentbox/confine.h"
#include "agentbox/host_caps.h"
#include "agentbox/policy.h"
#include "confine/layers.h"
#include "host_facts.h"
#include "session/world.h"
#include "world_helpers.h"

namespace agentbox::session {
namespace {

using world_test::Bin;
using world_test::Children;
using world_test::Read;

// A temporary directory outside /tmp: the world's /tmp is a tmpfs of its
// own, and a graft goes only where the world's root tmpfs is.
std::string MakeDir(const std::string& parent, const char* what) {
  std::string t = parent + "/agentbox-graft-" + what + ".XXXXXX";
  return mkdtemp(t.data()) ? t : "";
}

// The pids of `parent`'s children.
std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  std::istringstream in(Read("/proc/" + std::to_string(parent) + "/task/" + std::to_string(parent) + "/children"));
  for (pid_t p; in >> p;) out.push_back(p);
  return out;
}

class GraftTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(Bin().empty()) << "AGENTBOX_BIN must name the agentbox binary";
    const char* tmp = std::getenv("TMPDIR");
    workspace_ = MakeDir(tmp ? tmp : "/tmp", "ws");
    // /var/tmp: writable for every user, and outside what the world mounts.
    outer_ = MakeDir("/var/tmp", "host");
    ASSERT_FALSE(workspace_.empty());
    ASSERT_FALSE(outer_.empty()) << "cannot make a directory in /var/tmp";
    dir_ = outer_ + "/data";
    ASSERT_EQ(mkdir(dir_.c_str(), 0755), 0);
    std::ofstream(dir_ + "/f") << "secret-of-the-host\n";
  }
  void TearDown() override {
    worlds_.clear();  // Stop(0) each
    system(("rm -rf " + workspace_ + " " + outer_).c_str());
    EXPECT_TRUE(Children().empty()) << "a world's process outlived its test";
  }

  // A world under `extra_yaml` (on top of workspace-write); nullptr (with a
  // skip or a failure) when none can start here.
  World* Start(const std::string& extra_yaml) {
    auto policy = ParsePolicy("mode: workspace-write\n" + extra_yaml, "test");
    EXPECT_TRUE(policy.ok()) << policy.status().ToString();
    if (!policy.ok()) return nullptr;
    HostCaps host = ProbeHostFor(*policy);
    if (!host.user_namespaces) {
      skip_ = "not applicable here: sessions need user namespaces";
      return nullptr;
    }
    Invocation inv;
    inv.workspace = workspace_;
    inv.cwd = workspace_;
    inv.home = "/nonexistent-home";
    inv.self_exe = Bin();
    inv.nonce = "0123456789abcdef";
    inv.session = true;
    auto confined = Confine({"true"}, *policy, host, inv);
    EXPECT_TRUE(confined.ok()) << confined.status().ToString();
    if (!confined.ok()) return nullptr;
    plan_ = confined->plan;
    plan_.timeout_ms.reset();
    auto world = World::Start(Bin(), plan_, 15000);
    EXPECT_TRUE(world.ok()) << world.status().ToString();
    if (!world.ok()) return nullptr;
    worlds_.push_back(std::move(*world));
    return worlds_.back().get();
  }

  WorldExecResult Run(World* w, const std::string& command) {
    WorldExec e;
    e.argv = {"bash", "-c", command};
    e.timeout_ms = 20000;
    auto r = w->Exec(e, nullptr, nullptr);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : WorldExecResult{};
  }

  // The world's init, as the host sees it: the supervisor's only child.
  pid_t Init(World* w) {
    auto kids = ChildrenOf(w->supervisor_pid());
    return kids.size() == 1 ? kids[0] : -1;
  }

  std::string Ceiling(const std::string& key, const std::string& path) {
    return "on_violation:\n  escalation: one_time_approval\n  max_grant:\n    " + key + ": [" + path + "]\n";
  }

  std::string workspace_, outer_, dir_, skip_;
  Plan plan_;
  std::vector<std::unique_ptr<World>> worlds_;
};

TEST_F(GraftTest, AGraftedDirectoryIsReadableUntilUngrafted) {
  World* w = Start(Ceiling("filesystem_read", outer_));
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  ASSERT_NE(w, nullptr);
  // The ceiling's directory is there, empty, with a Landlock rule: what is
  // grafted below it is covered.
  EXPECT_TRUE(LandlockCovers(plan_.landlock, dir_, false));
  EXPECT_FALSE(LandlockCovers(plan_.landlock, dir_, true));
  auto before = Run(w, "cat " + dir_ + "/f");
  EXPECT_NE(before.exit_code, std::optional<int>(0));
  EXPECT_EQ(before.output.find("secret-of-the-host"), std::string::npos) << before.output;
  const pid_t sup = w->supervisor_pid(), init = Init(w);
  ASSERT_GT(init, 0);

  Status g = w->GraftPath(dir_, dir_, false);
  ASSERT_TRUE(g.ok()) << g.ToString();
  auto read = Run(w, "cat " + dir_ + "/f");
  EXPECT_EQ(read.exit_code, std::optional<int>(0)) << read.output;
  EXPECT_EQ(read.output, "secret-of-the-host\n");
  // Read-only: the mount refuses the write (Landlock would too).
  auto write = Run(w, "echo x > " + dir_ + "/new 2>&1; echo x >> " + dir_ + "/f 2>&1; exit 0");
  struct stat st {};
  EXPECT_NE(stat((dir_ + "/new").c_str(), &st), 0) << write.output;
  EXPECT_EQ(Read(dir_ + "/f"), "secret-of-the-host\n");
  // nosuid, nodev and ro, as the world's mount table says.
  auto mountinfo = Run(w, "grep ' " + dir_ + " ' /proc/self/mountinfo");
  EXPECT_NE(mountinfo.output.find(" ro,"), std::string::npos) << mountinfo.output;
  EXPECT_NE(mountinfo.output.find("nosuid"), std::string::npos) << mountinfo.output;
  EXPECT_NE(mountinfo.output.find("nodev"), std::string::npos) << mountinfo.output;
  // The same world: the same supervisor and the same init.
  EXPECT_EQ(w->supervisor_pid(), sup);
  EXPECT_EQ(Init(w), init);
  // The root stays sealed around the new mountpoint.
  auto sealed = Run(w, "mkdir /agentbox-escape 2>&1; exit 0");
  EXPECT_NE(sealed.output.find("Read-only file system"), std::string::npos) << sealed.output;

  Status twice = w->GraftPath(dir_, dir_, false);
  EXPECT_FALSE(twice.ok());

  Status u = w->UngraftPath(dir_);
  ASSERT_TRUE(u.ok()) << u.ToString();
  auto after = Run(w, "cat " + dir_ + "/f");
  EXPECT_NE(after.exit_code, std::optional<int>(0));
  EXPECT_EQ(after.output.find("secret-of-the-host"), std::string::npos) << after.output;
  EXPECT_EQ(Init(w), init);
  Status again = w->UngraftPath(dir_);
  EXPECT_FALSE(again.ok());
  EXPECT_NE(again.message().find(dir_), std::string::npos) << again.ToString();
  // Nothing of the graft is left on the host side.
  EXPECT_EQ(Read("/proc/self/mountinfo").find(dir_), std::string::npos);
}

TEST_F(GraftTest, AWritableGraftWritesToTheHost) {
  World* w = Start(Ceiling("filesystem_write", outer_));
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(LandlockCovers(plan_.landlock, dir_, true));
  Status g = w->GraftPath(dir_, dir_, true);
  ASSERT_TRUE(g.ok()) << g.ToString();
  auto r = Run(w, "echo from-inside > " + dir_ + "/made && cat " + dir_ + "/f");
  EXPECT_EQ(r.exit_code, std::optional<int>(0)) << r.output;
  EXPECT_EQ(Read(dir_ + "/made"), "from-inside\n");
  // Still nosuid and nodev.
  auto mountinfo = Run(w, "grep ' " + dir_ + " ' /proc/self/mountinfo");
  EXPECT_NE(mountinfo.output.find(" rw,"), std::string::npos) << mountinfo.output;
  EXPECT_NE(mountinfo.output.find("nosuid"), std::string::npos) << mountinfo.output;
  ASSERT_TRUE(w->UngraftPath(dir_).ok());
}

// A graft makes its mountpoint without unsealing the world's root: a
// process inside, with Landlock's write right on a write ceiling's
// directory (only the read-only root stops it there), tries to create an
// entry in it all the while grafts come and go, and never can.
TEST_F(GraftTest, NothingInsideCanWriteToTheRootWhileAGraftIsMade) {
  World* w = Start(Ceiling("filesystem_write", outer_));
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(LandlockCovers(plan_.landlock, outer_ + "/race", true)) << "the racer must have the write right";
  // A tight loop (a syscall at a time, no fork), told to stop by a file.
  const std::string racer =
      "import os\n"
      "open('/tmp/race-pid', 'w').write(str(os.getpid()))\n"
      "won = 0\n"
      "while not os.path.exists('/tmp/race-stop'):\n"
      "    try:\n"
      "        os.mkdir('" + outer_ + "/race')\n"
      "        won += 1\n"
      "        os.rmdir('" + outer_ + "/race')\n"
      "    except OSError:\n"
      "        pass\n"
      "open('/tmp/race-won.part', 'w').write(str(won))\n"
      "os.rename('/tmp/race-won.part', '/tmp/race-won')\n";  // whole when it appears
  std::ofstream(workspace_ + "/racer.py") << racer;
  auto started = Run(w, "python3 racer.py >/dev/null 2>&1 & for i in $(seq 50); do test -e /tmp/race-pid && break; sleep 0.1; done");
  for (int i = 0; i < 200; ++i) {
    Status g = w->GraftPath(dir_, dir_, true);
    ASSERT_TRUE(g.ok()) << i << ": " << g.ToString();
    Status u = w->UngraftPath(dir_);
    ASSERT_TRUE(u.ok()) << i << ": " << u.ToString();
  }
  auto racing = Run(w, "test -d /proc/$(cat /tmp/race-pid) && echo racing");
  EXPECT_EQ(racing.output, "racing\n") << "the racer ended before the grafts did: the test proved nothing";
  auto won = Run(w, "touch /tmp/race-stop; for i in $(seq 100); do test -e /tmp/race-won && break; sleep 0.1; done; "
                    "cat /tmp/race-won");
  EXPECT_EQ(won.output, "0") << "a process inside wrote to the world's root while a graft was made";
}

// A single file, grafted at a path of its own.
TEST_F(GraftTest, AFileCanBeGrafted) {
  World* w = Start(Ceiling("filesystem_read", outer_));
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  ASSERT_NE(w, nullptr);
  Status g = w->GraftPath(dir_ + "/f", outer_ + "/only-f", false);
  ASSERT_TRUE(g.ok()) << g.ToString();
  auto r = Run(w, "cat " + outer_ + "/only-f; ls " + outer_);
  EXPECT_EQ(r.output, "secret-of-the-host\nonly-f\n");
  ASSERT_TRUE(w->UngraftPath(outer_ + "/only-f").ok());
  EXPECT_EQ(Run(w, "ls -A " + outer_).output, "");
}

// Landlock's rules are made at the world's start: without a ceiling tree
// above it, a grafted path is mounted and still denied. (This is what
// makes the ceiling's directory and rule necessary.)
TEST_F(GraftTest, WithoutACeilingAboveItLandlockDeniesTheGraft) {
  const std::string elsewhere = MakeDir("/var/tmp", "elsewhere");
  ASSERT_FALSE(elsewhere.empty());
  World* w = Start(Ceiling("filesystem_read", elsewhere));
  if (!skip_.empty()) {
    rmdir(elsewhere.c_str());
    GTEST_SKIP() << skip_;
  }
  ASSERT_NE(w, nullptr);
  if (plan_.landlock.abi <= 0) {
    rmdir(elsewhere.c_str());
    GTEST_SKIP() << "not applicable here: no Landlock on this kernel, so nothing to deny the graft";
  }
  EXPECT_FALSE(LandlockCovers(plan_.landlock, dir_, false));
  Status g = w->GraftPath(dir_, dir_, false);
  ASSERT_TRUE(g.ok()) << g.ToString();
  auto mounted = Run(w, "grep -c ' " + dir_ + " ' /proc/self/mountinfo");
  EXPECT_EQ(mounted.output, "1\n");
  auto r = Run(w, "cat " + dir_ + "/f 2>&1");
  EXPECT_NE(r.exit_code, std::optional<int>(0));
  EXPECT_NE(r.output.find("Permission denied"), std::string::npos) << r.output;
  // The ceiling's own directory as the target: a mount there hides the
  // directory the rule is on, so Landlock judges it by the rules above.
  EXPECT_FALSE(LandlockCovers(plan_.landlock, elsewhere, false));
  Status at_ceiling = w->GraftPath(dir_, elsewhere, false);
  ASSERT_TRUE(at_ceiling.ok()) << at_ceiling.ToString();
  auto denied = Run(w, "cat " + elsewhere + "/f 2>&1");
  EXPECT_NE(denied.output.find("Permission denied"), std::string::npos) << denied.output;
  ASSERT_TRUE(w->UngraftPath(elsewhere).ok());
  ASSERT_TRUE(w->UngraftPath(dir_).ok());
  worlds_.clear();
  rmdir(elsewhere.c_str());
}

TEST_F(GraftTest, TargetsInsideOtherMountsAreRefused) {
  World* w = Start(Ceiling("filesystem_read", outer_));
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  ASSERT_NE(w, nullptr);
  // Inside the bound /usr, the private /tmp, the workspace; and /usr itself.
  for (const std::string& target : std::vector<std::string>{"/usr/share/agentbox-graft-target", "/tmp/agentbox-graft-target",
                                   workspace_ + "/graft-target", std::string("/usr")}) {
    Status s = w->GraftPath(dir_, target, false);
    EXPECT_FALSE(s.ok()) << target;
    EXPECT_EQ(s.stage(), "graft") << s.ToString();
    EXPECT_NE(s.message().find(target), std::string::npos) << s.ToString();
  }
  // A source that is missing, or reached through a symlink, is refused by name.
  Status missing = w->GraftPath(outer_ + "/absent", outer_ + "/x", false);
  EXPECT_FALSE(missing.ok());
  EXPECT_EQ(missing.path(), outer_ + "/absent") << missing.ToString();
  ASSERT_EQ(symlink(dir_.c_str(), (outer_ + "/link").c_str()), 0);
  Status link = w->GraftPath(outer_ + "/link", outer_ + "/x", false);
  EXPECT_FALSE(link.ok());
  EXPECT_EQ(link.err(), ELOOP) << link.ToString();
  // Nothing was left behind on the sealed root.
  EXPECT_EQ(Run(w, "ls -A " + outer_).output, "");
  Status relative = w->GraftPath(dir_, "var/../x", false);
  EXPECT_FALSE(relative.ok());
}

TEST_F(GraftTest, TheMemoryLimitChangesInPlace) {
  // The host fact, checked without agentbox: a child cgroup with the memory
  // controller. Without one, a memory limit is refused (fail closed) and
  // there is no limit to change.
  if (!host_facts::CgroupsExpected({"memory"})) {
    GTEST_SKIP() << "not applicable here: no writable cgroup with the memory controller for this user";
  }
  World* w = Start("resources:\n  memory_gib: 0.25\n");
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  ASSERT_NE(w, nullptr);
  ASSERT_FALSE(w->cgroup_mechanism().empty()) << "a memory limit was enforced, so the world has a cgroup";
  const pid_t init = Init(w);
  ASSERT_GT(init, 0);
  // The init's cgroup, read from the host side.
  std::string rel;
  bool v2 = false;
  std::istringstream lines(Read("/proc/" + std::to_string(init) + "/cgroup"));
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("0::", 0) == 0) {
      rel = line.substr(3);
      v2 = true;
    } else if (line.find(":memory:") != std::string::npos) {
      rel = line.substr(line.find(":memory:") + 8);
      v2 = false;
      break;
    }
  }
  const std::string file = v2 ? "/sys/fs/cgroup" + rel + "/memory.max"
                              : "/sys/fs/cgroup/memory" + rel + "/memory.limit_in_bytes";
  const std::string old_limit = Read(file);
  if (old_limit.empty()) GTEST_SKIP() << "not applicable here: " << file << " is not readable from this side";
  EXPECT_EQ(old_limit, std::to_string(256ull << 20) + "\n");
  // 384 MiB would be killed under the old limit; under the new one it lives.
  auto killed = Run(w, "python3 -c 'b = bytearray(384 << 20); b[::4096] = b\"x\" * len(b[::4096]); print(\"held\")'");
  EXPECT_EQ(killed.output.find("held"), std::string::npos) << killed.output;
  Status s = w->SetMemoryLimit(768ull << 20);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Read(file), std::to_string(768ull << 20) + "\n");
  auto held = Run(w, "python3 -c 'b = bytearray(384 << 20); b[::4096] = b\"x\" * len(b[::4096]); print(\"held\")'");
  EXPECT_EQ(held.output, "held\n");
  EXPECT_EQ(Init(w), init);
}

TEST_F(GraftTest, AWorldWithoutAMemoryControllerSaysSo) {
  World* w = Start("");
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  ASSERT_NE(w, nullptr);
  Status s = w->SetMemoryLimit(512ull << 20);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("memory"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace agentbox::session
