// Delegation over a fake cgroupfs: the record (parsing, who may have
// written it), the ownership check that decides whether a delegated
// directory is used, the v2 migration rule, and setup-delegation's plan.
#include "linux/cgroup_delegation.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "linux/fake_cgroupfs.h"

namespace agentbox::linux {
namespace {

namespace fs = std::filesystem;

constexpr uid_t kUser = 4242;

using fake_cgroupfs::FakeRoot;
using fake_cgroupfs::kHybridMountinfo;
using fake_cgroupfs::kHybridSelf;
using fake_cgroupfs::kV2Mountinfo;

const std::string kMemDeleg = "/sys/fs/cgroup/memory/t/agentbox-delegate-u";
const std::string kPidsDeleg = "/sys/fs/cgroup/pids/t/agentbox-delegate-u";

DelegationRecord HybridRecord() {
  DelegationRecord r;
  r.user = "u";
  r.uid = kUser;
  r.gid = kUser;
  r.v1 = {{"memory", kMemDeleg}, {"pids", kPidsDeleg}};
  return r;
}

// ------------------------------------------------------------------ record

TEST(DelegationRecord, RoundTripsThroughJson) {
  DelegationRecord r = HybridRecord();
  r.v2_dir = "/sys/fs/cgroup/unified/agentbox-delegate-u";
  r.v2_controllers = {"memory", "pids"};
  r.v2_entry = r.v2_dir + "/login";
  auto back = ParseDelegationRecord(DelegationRecordJson(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->user, "u");
  EXPECT_EQ(back->uid, kUser);
  EXPECT_EQ(back->v1, r.v1);
  EXPECT_EQ(back->v2_dir, r.v2_dir);
  EXPECT_EQ(back->v2_controllers, r.v2_controllers);
  EXPECT_EQ(back->v2_entry, r.v2_entry);
}

TEST(DelegationRecord, RejectsWhatSetupDelegationNeverWrites) {
  EXPECT_FALSE(ParseDelegationRecord("not json").ok());
  EXPECT_FALSE(ParseDelegationRecord(R"({"version":2,"user":"u","uid":1,"gid":1,"v1":{},"v2":null})").ok());
  EXPECT_FALSE(ParseDelegationRecord(R"({"version":1,"user":"u","uid":1,"gid":1,"v1":{"memory":"rel/dir"},"v2":null})")
                   .ok());
  EXPECT_FALSE(
      ParseDelegationRecord(R"({"version":1,"user":"u","uid":1,"gid":1,"v1":{"memory":"/a/../b"},"v2":null})").ok());
  EXPECT_FALSE(ParseDelegationRecord(R"({"version":1,"user":"u","uid":1,"gid":1,"v1":{}})").ok());  // no v2 key
  EXPECT_TRUE(ParseDelegationRecord(R"({"version":1,"user":"u","uid":1,"gid":1,"v1":{},"v2":null})").ok());
}

TEST(DelegationRecord, OnlyARootOwnedRecordOnlyRootMayWriteIsRead) {
  if (geteuid() != 0) GTEST_SKIP() << "not applicable here: making files owned by others needs root";
  FakeRoot root;
  const std::string dir = root.root() + "/rec";
  auto none = ReadDelegationRecord(dir, kUser);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value());

  const mode_t old_umask = umask(077);  // root's umask does not hide the record from its user
  Status written = WriteDelegationRecord(dir + "/deeper", HybridRecord());
  umask(old_umask);
  ASSERT_TRUE(written.ok()) << written.ToString();
  struct stat dst {};
  ASSERT_EQ(stat((dir + "/deeper").c_str(), &dst), 0);
  EXPECT_EQ(dst.st_mode & 0777, 0755u);
  ASSERT_TRUE(WriteDelegationRecord(dir, HybridRecord()).ok());
  const std::string path = DelegationRecordPath(dir, kUser);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  auto got = ReadDelegationRecord(dir, kUser);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->v1.at("memory"), kMemDeleg);

  // Another uid's record is not ours.
  ASSERT_EQ(rename(path.c_str(), DelegationRecordPath(dir, kUser + 1).c_str()), 0);
  auto other = ReadDelegationRecord(dir, kUser + 1);
  EXPECT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("is for uid 4242"), std::string::npos) << other.status().message();
  ASSERT_EQ(rename(DelegationRecordPath(dir, kUser + 1).c_str(), path.c_str()), 0);

  // Writable by the group, or owned by the user: not setup-delegation's.
  ASSERT_EQ(chmod(path.c_str(), 0664), 0);
  EXPECT_FALSE(ReadDelegationRecord(dir, kUser).ok());
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  ASSERT_EQ(chown(path.c_str(), kUser, kUser), 0);
  auto users = ReadDelegationRecord(dir, kUser);
  EXPECT_FALSE(users.ok());
  EXPECT_NE(users.status().message().find("root-owned"), std::string::npos) << users.status().message();

  ASSERT_TRUE(RemoveDelegationRecord(dir, kUser).ok());
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(RemoveDelegationRecord(dir, kUser).ok());  // twice is fine
}

// --------------------------------------------------------------- using it

class HybridDelegated : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "not applicable here: making directories owned by others needs root";
    root_.Put("/proc/self/mountinfo", kHybridMountinfo);
    root_.Put("/proc/self/cgroup", "8:pids:/own\n4:memory:/process_api/abc\n2:cpuacct:/own\n1:cpu:/own\n0::/\n");
    // Our own cgroups are not there to write in (as for a user without
    // delegation: ChooseHierarchy finds nothing); the delegated ones are.
    root_.Owned(kMemDeleg, kUser);
    root_.Owned(kPidsDeleg, kUser);
  }
  FakeRoot root_;
};

TEST_F(HybridDelegated, OwnedDirectoriesStandForOurOwnCgroup) {
  CgroupFs fs(root_.root());
  CgroupLayout l = DiscoverCgroupLayout(fs);
  ASSERT_EQ(ChooseHierarchy(fs, l, "memory"), Hierarchy::kNone);
  UseDelegation(fs, HybridRecord(), kUser, &l);
  EXPECT_TRUE(l.delegation_notes.empty()) << l.delegation_notes[0];
  EXPECT_EQ(l.v1_dirs["memory"], kMemDeleg);
  EXPECT_EQ(l.v1_dirs["pids"], kPidsDeleg);
  EXPECT_EQ(l.delegated["memory"], kMemDeleg);
  EXPECT_EQ(ChooseHierarchy(fs, l, "memory"), Hierarchy::kV1);
  EXPECT_EQ(ChooseHierarchy(fs, l, "cpu"), Hierarchy::kNone);  // not delegated

  // The run's cgroup is a child of the delegated directory.
  ResourceLimits lim;
  lim.memory_max_bytes = 64ull << 20;
  lim.pids_max = 50;
  const std::string name = "agentbox-0000000000000001";
  {
    auto cg = SandboxCgroup::Create(fs, l, lim, name);
    ASSERT_TRUE(cg.ok()) << cg.status().ToString();
    EXPECT_EQ(root_.Get(kMemDeleg + "/" + name + "/memory.limit_in_bytes"), "67108864");
    EXPECT_EQ(root_.Get(kPidsDeleg + "/" + name + "/pids.max"), "50");
  }
  EXPECT_FALSE(root_.Has(kMemDeleg + "/" + name));
}

TEST_F(HybridDelegated, ADirectoryOwnedBySomeoneElseIsNotUsed) {
  CgroupFs fs(root_.root());
  CgroupLayout l = DiscoverCgroupLayout(fs);
  ASSERT_EQ(chown((root_.root() + kPidsDeleg).c_str(), kUser + 1, kUser + 1), 0);
  UseDelegation(fs, HybridRecord(), kUser, &l);
  EXPECT_EQ(l.v1_dirs["memory"], kMemDeleg);
  EXPECT_EQ(l.v1_dirs["pids"], "/sys/fs/cgroup/pids/own");  // our own, unchanged
  EXPECT_FALSE(l.delegated.count("pids"));
  ASSERT_EQ(l.delegation_notes.size(), 1u);
  EXPECT_NE(l.delegation_notes[0].find("owned by uid 4243, not by uid 4242"), std::string::npos)
      << l.delegation_notes[0];
}

TEST_F(HybridDelegated, ASymlinkOrADirectoryOutsideItsHierarchyIsNotUsed) {
  CgroupFs fs(root_.root());
  CgroupLayout l = DiscoverCgroupLayout(fs);
  DelegationRecord r = HybridRecord();
  r.v1["memory"] = kPidsDeleg;  // another hierarchy's directory
  root_.Owned("/sys/fs/cgroup/pids/t/real", kUser);
  fs::create_directory_symlink(root_.root() + "/sys/fs/cgroup/pids/t/real",
                               root_.root() + "/sys/fs/cgroup/pids/t/link");
  r.v1["pids"] = "/sys/fs/cgroup/pids/t/link";
  UseDelegation(fs, r, kUser, &l);
  EXPECT_TRUE(l.delegated.empty());
  ASSERT_EQ(l.delegation_notes.size(), 2u);
  EXPECT_NE(l.delegation_notes[0].find("not below the hierarchy's mount point /sys/fs/cgroup/memory"),
            std::string::npos)
      << l.delegation_notes[0];
  EXPECT_NE(l.delegation_notes[1].find("O_NOFOLLOW"), std::string::npos) << l.delegation_notes[1];
}

TEST_F(HybridDelegated, StaleRunCgroupsInTheDelegatedDirectoryAreCollected) {
  CgroupFs fs(root_.root());
  CgroupLayout l = DiscoverCgroupLayout(fs);
  UseDelegation(fs, HybridRecord(), kUser, &l);
  // pid 999999 does not exist in this fake /proc: its supervisor is gone.
  const std::string stale = kMemDeleg + "/agentbox-4026531836-999999-5-ab";
  root_.Dir(stale);
  auto removed = CollectStaleCgroups(fs, l);
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0], stale);
  EXPECT_FALSE(root_.Has(stale));
}

// The v2 migration rule: a delegated v2 directory serves only a process inside it.
class V2Delegated : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "not applicable here: making directories owned by others needs root";
    root_.Put("/proc/self/mountinfo", kV2Mountinfo);
    root_.Owned(kDir, kUser);
    root_.Put(kDir + "/cgroup.controllers", "cpu memory pids\n");
    root_.Put(kDir + "/cgroup.subtree_control", "cpu memory pids\n");
    root_.Owned(kDir + "/login", kUser);
    root_.Put(kDir + "/login/cgroup.controllers", "cpu memory pids\n");
    root_.Put(kDir + "/login/cgroup.subtree_control", "");
    record_.user = "u";
    record_.uid = kUser;
    record_.v2_dir = kDir;
    record_.v2_controllers = {"cpu", "memory", "pids"};
    record_.v2_entry = kDir + "/login";
  }
  const std::string kDir = "/sys/fs/cgroup/delegated/agentbox-delegate-u";
  FakeRoot root_;
  DelegationRecord record_;
};

TEST_F(V2Delegated, UnusedFromOutsideWithTheRuleNamed) {
  root_.Put("/proc/self/cgroup", "0::/user.slice/session-1.scope\n");
  CgroupFs fs(root_.root());
  CgroupLayout l = DiscoverCgroupLayout(fs);
  UseDelegation(fs, record_, kUser, &l);
  EXPECT_EQ(l.v2_dir, "/sys/fs/cgroup/user.slice/session-1.scope");
  EXPECT_FALSE(l.delegated.count("v2"));
  ASSERT_EQ(l.delegation_notes.size(), 1u);
  EXPECT_NE(l.delegation_notes[0].find("common ancestor"), std::string::npos) << l.delegation_notes[0];
  EXPECT_NE(l.delegation_notes[0].find(kDir + "/login/cgroup.procs"), std::string::npos) << l.delegation_notes[0];
}

TEST_F(V2Delegated, UsedFromItsLoginLeafRunsGoBesideIt) {
  root_.Put("/proc/self/cgroup", "0::/delegated/agentbox-delegate-u/login\n");
  CgroupFs fs(root_.root());
  CgroupLayout l = DiscoverCgroupLayout(fs);
  ASSERT_EQ(ChooseHierarchy(fs, l, "memory"), Hierarchy::kNone);  // login holds us: no controller for a child
  UseDelegation(fs, record_, kUser, &l);
  EXPECT_TRUE(l.delegation_notes.empty()) << l.delegation_notes[0];
  EXPECT_EQ(l.v2_dir, kDir);
  EXPECT_EQ(l.delegated["v2"], kDir);
  EXPECT_EQ(ChooseHierarchy(fs, l, "memory"), Hierarchy::kV2);
  EXPECT_EQ(ChooseHierarchy(fs, l, "pids"), Hierarchy::kV2);
}

// A scope systemd delegated to us (run --systemd-scope): the supervisor
// moves into its leaf, the scope enables its controllers, runs go beside the leaf.
TEST(DelegatedScope, SupervisorMovesIntoALeafAndRunsGoBesideIt) {
  FakeRoot root;
  const std::string scope = "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope";
  root.Put("/proc/self/mountinfo", kV2Mountinfo);
  root.Put("/proc/self/cgroup", "0::/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope\n");
  root.Put(scope + "/cgroup.controllers", "cpu memory pids\n");
  root.Put(scope + "/cgroup.subtree_control", "");
  CgroupFs fs(root.root());
  // Owned by someone else: not delegated to us.
  Status other = EnterDelegatedScope(fs, geteuid() + 1);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.message().find("not delegated to this user"), std::string::npos) << other.message();

  Status s = EnterDelegatedScope(fs, geteuid());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(root.Get(scope + "/supervisor/cgroup.procs"), "0");       // the process itself
  EXPECT_EQ(root.Get(scope + "/cgroup.subtree_control"), "+cpu");  // the fake keeps the last write
  // What the kernel now says of us: in the leaf.
  root.Put("/proc/self/cgroup", "0::/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope/supervisor\n");
  root.Put(scope + "/cgroup.subtree_control", "cpu memory pids\n");
  CgroupLayout l = DiscoverCgroupLayout(fs);
  EXPECT_EQ(DelegatedScopeOf(l), scope);
  DelegationRecord own;
  own.v2_dir = scope;
  UseDelegation(fs, own, geteuid(), &l);
  EXPECT_EQ(l.v2_dir, scope);
  EXPECT_EQ(ChooseHierarchy(fs, l, "memory"), Hierarchy::kV2);
  EXPECT_TRUE(EnterDelegatedScope(fs, geteuid()).ok());  // entered already: nothing again
}

TEST(DelegatedScope, OnlyASystemdScopeIsEntered) {
  FakeRoot root;
  root.Put("/proc/self/mountinfo", kV2Mountinfo);
  root.Put("/proc/self/cgroup", "0::/user.slice/session-3.slice\n");
  root.Dir("/sys/fs/cgroup/user.slice/session-3.slice");
  CgroupFs fs(root.root());
  Status s = EnterDelegatedScope(fs, geteuid());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("is not a systemd scope"), std::string::npos) << s.message();
  EXPECT_FALSE(root.Has("/sys/fs/cgroup/user.slice/session-3.slice/supervisor"));
}

// ------------------------------------------------------- setup-delegation

TEST(DelegationPlan, DefaultsToRootsOwnCgroupPerHierarchy) {
  FakeRoot root;
  root.Put("/proc/self/mountinfo", kHybridMountinfo);
  root.Put("/proc/self/cgroup", kHybridSelf);
  root.Put("/sys/fs/cgroup/unified/cgroup.controllers", "");
  CgroupFs fs(root.root());
  auto plan = PlanDelegation(fs, DiscoverCgroupLayout(fs), "u", kUser, kUser, {});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::map<std::string, std::string> dirs;
  for (const auto& t : plan->targets) {
    EXPECT_EQ(t.hierarchy, "v1");
    ASSERT_EQ(t.controllers.size(), 1u);
    dirs[t.controllers[0]] = t.dir;
  }
  EXPECT_EQ(dirs["memory"], "/sys/fs/cgroup/memory/process_api/abc/agentbox-delegate-u");
  EXPECT_EQ(dirs["pids"], "/sys/fs/cgroup/pids/agentbox-delegate-u");
  EXPECT_EQ(dirs["cpu"], "/sys/fs/cgroup/cpu/agentbox-delegate-u");
  EXPECT_EQ(dirs["cpuacct"], "/sys/fs/cgroup/cpuacct/agentbox-delegate-u");
  EXPECT_EQ(dirs.size(), 4u);
  ASSERT_EQ(plan->notes.size(), 1u);
  EXPECT_NE(plan->notes[0].find("v2: not delegated"), std::string::npos) << plan->notes[0];
}

TEST(DelegationPlan, ParentsNameExactlyTheHierarchiesAndMustExist) {
  FakeRoot root;
  root.Put("/proc/self/mountinfo", kHybridMountinfo);
  root.Put("/proc/self/cgroup", kHybridSelf);
  root.Dir("/sys/fs/cgroup/pids/test");
  CgroupFs fs(root.root());
  CgroupLayout l = DiscoverCgroupLayout(fs);
  auto plan = PlanDelegation(fs, l, "u", kUser, kUser, {"/sys/fs/cgroup/pids/test/"});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->targets.size(), 1u);
  EXPECT_EQ(plan->targets[0].dir, "/sys/fs/cgroup/pids/test/agentbox-delegate-u");
  EXPECT_EQ(plan->targets[0].controllers, std::vector<std::string>{"pids"});

  auto missing = PlanDelegation(fs, l, "u", kUser, kUser, {"/sys/fs/cgroup/memory/nope"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().err(), ENOENT);
  EXPECT_EQ(missing.status().path(), "/sys/fs/cgroup/memory/nope");
  auto outside = PlanDelegation(fs, l, "u", kUser, kUser, {"/tmp"});
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.status().message().find("--parent /tmp"), std::string::npos);
}

TEST(DelegationPlan, AppliedTwiceHandsTheFilesToTheUserAndRemovesCleanly) {
  if (geteuid() != 0) GTEST_SKIP() << "not applicable here: chown needs root";
  FakeRoot root;
  root.Put("/proc/self/mountinfo", kHybridMountinfo);
  root.Put("/proc/self/cgroup", kHybridSelf);
  root.Put("/sys/fs/cgroup/unified/cgroup.controllers", "memory pids\n");
  root.Put("/sys/fs/cgroup/unified/cgroup.subtree_control", "");
  CgroupFs fs(root.root());
  auto plan = PlanDelegation(fs, DiscoverCgroupLayout(fs), "u", kUser, kUser, {});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  // What the kernel would put in each new cgroup (a fake mkdir makes none).
  const std::string pids = "/sys/fs/cgroup/pids/agentbox-delegate-u";
  const std::string v2 = "/sys/fs/cgroup/unified/agentbox-delegate-u";
  for (const auto& t : plan->targets) {
    for (const char* f : {"tasks", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control"}) {
      root.Put(t.dir + "/" + f, "");
    }
  }
  for (const char* f : {"cgroup.procs", "cgroup.threads", "cgroup.subtree_control"}) root.Put(v2 + "/login/" + f, "");
  for (int round = 0; round < 2; ++round) {
    std::vector<std::string> notes;
    auto rec = ApplyDelegation(fs, *plan, &notes);
    ASSERT_TRUE(rec.ok()) << rec.status().ToString();
    EXPECT_TRUE(notes.empty()) << notes[0];
    EXPECT_EQ(rec->v1.at("pids"), pids);
    EXPECT_EQ(rec->v2_dir, v2);
    EXPECT_EQ(rec->v2_entry, v2 + "/login");
    EXPECT_EQ(rec->v2_controllers, (std::vector<std::string>{"memory", "pids"}));
  }
  for (const std::string& p : {pids, pids + "/tasks", pids + "/cgroup.procs", v2, v2 + "/cgroup.procs",
                              v2 + "/cgroup.threads", v2 + "/cgroup.subtree_control", v2 + "/login",
                              v2 + "/login/cgroup.procs"}) {
    EXPECT_EQ(root.Owner(p), kUser) << p;
  }
  // The memory file of the delegated cgroup itself stays root's.
  root.Put(pids + "/pids.max", "max");
  EXPECT_EQ(root.Owner(pids + "/pids.max"), 0u);
  // Controllers enabled for the directory (in the parent) and for its children.
  EXPECT_EQ(root.Get("/sys/fs/cgroup/unified/cgroup.subtree_control"), "+pids");  // the fake keeps the last write
  EXPECT_EQ(root.Get(v2 + "/cgroup.subtree_control"), "+pids");

  // --remove: refused while a child cgroup is there, named; done once it is gone.
  root.Dir(pids + "/mine");
  Status busy = RemoveDelegation(fs, *plan, std::nullopt);
  ASSERT_FALSE(busy.ok());
  EXPECT_NE(busy.message().find(pids + ": it still has the child cgroup mine"), std::string::npos) << busy.message();
  EXPECT_TRUE(root.Has(pids));
  fs::remove(root.root() + pids + "/mine");
  // A fake cgroup keeps its files: clear them as the kernel's rmdir would.
  for (const auto& t : plan->targets) {
    for (const auto& e : fs::directory_iterator(root.root() + t.dir)) {
      if (e.is_regular_file()) fs::remove(e.path());
    }
  }
  for (const auto& e : fs::directory_iterator(root.root() + v2 + "/login")) fs::remove(e.path());
  Status s = RemoveDelegation(fs, *plan, std::nullopt);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (const auto& t : plan->targets) EXPECT_FALSE(root.Has(t.dir)) << t.dir;
  EXPECT_TRUE(RemoveDelegation(fs, *plan, std::nullopt).ok());  // twice is fine
}

}  // namespace
}  // namespace agentbox::linux
