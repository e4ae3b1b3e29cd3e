// Cgroups over a fake cgroupfs: a temp directory holding /proc/self files and
// cgroup directories of plain files, in the pure-v2 and the hybrid layout.
#include "linux/cgroups.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "linux/fake_cgroupfs.h"

namespace agentbox::linux {
namespace {

namespace fs = std::filesystem;

using fake_cgroupfs::FakeRoot;
using fake_cgroupfs::kHybridMountinfo;
using fake_cgroupfs::kHybridSelf;
using fake_cgroupfs::kV2Mountinfo;

ResourceLimits AllLimits() {
  ResourceLimits l;
  l.memory_max_bytes = 64ull << 20;
  l.memory_low_bytes = 32ull << 20;
  l.cpu_max_cores = 0.5;
  l.cpu_weight_cores = 2;
  l.pids_max = 100;
  return l;
}

// ------------------------------------------------------------------ parsing

TEST(CgroupLayout, PureV2) {
  CgroupLayout l = ParseCgroupLayout(kV2Mountinfo, "0::/user.slice/user-1000.slice/session-2.scope\n");
  EXPECT_EQ(l.v2_dir, "/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope");
  EXPECT_FALSE(l.v2_is_root);
  EXPECT_TRUE(l.v1_dirs.empty());
}

TEST(CgroupLayout, HybridNestsUnderOwnCgroupPerHierarchy) {
  CgroupLayout l = ParseCgroupLayout(kHybridMountinfo, kHybridSelf);
  EXPECT_EQ(l.v2_dir, "/sys/fs/cgroup/unified");
  EXPECT_TRUE(l.v2_is_root);
  EXPECT_EQ(l.v1_dirs.at("memory"), "/sys/fs/cgroup/memory/process_api/abc");
  EXPECT_EQ(l.v1_dirs.at("pids"), "/sys/fs/cgroup/pids");
  EXPECT_EQ(l.v1_dirs.at("cpu"), "/sys/fs/cgroup/cpu");
}

TEST(CgroupLayout, BindMountedSubtreeRoot) {
  // A container without a cgroup namespace: the mount shows only our part.
  CgroupLayout l = ParseCgroupLayout(
      "40 30 0:23 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n", "0::/docker/abc/inner\n");
  EXPECT_EQ(l.v2_dir, "/sys/fs/cgroup/inner");
  EXPECT_FALSE(l.v2_is_root);
}

TEST(CgroupLayout, NothingMounted) {
  CgroupLayout l = ParseCgroupLayout("", "0::/\n");
  EXPECT_TRUE(l.v2_dir.empty());
  EXPECT_TRUE(l.v1_dirs.empty());
}

TEST(CgroupStatsParsing, KeyedValues) {
  EXPECT_EQ(KeyedValue("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\n", "oom_kill"), 2u);
  EXPECT_EQ(KeyedValue("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n", "oom_kill"), 7u);
  EXPECT_EQ(KeyedValue("oom_kill_disable 0\nunder_oom 0\n", "oom_kill"), std::nullopt);
  EXPECT_EQ(KeyedValue("usage_usec 10\nuser_usec 7\nsystem_usec 3\n", "system_usec"), 3u);
}

// ---------------------------------------------------------------- pure v2

class PureV2 : public ::testing::Test {
 protected:
  void SetUp() override {
    root_.Put("/proc/self/mountinfo", kV2Mountinfo);
    root_.Put("/proc/self/cgroup", "0::/agents\n");
    root_.Put("/sys/fs/cgroup/agents/cgroup.controllers", "cpuset cpu io memory pids\n");
    root_.Put("/sys/fs/cgroup/agents/cgroup.subtree_control", "cpu memory pids\n");
  }
  FakeRoot root_;
};

TEST_F(PureV2, DiscoversDelegatedControllers) {
  CgroupFs fs(root_.root());
  CgroupLayout l = DiscoverCgroupLayout(fs);
  EXPECT_EQ(l.v2_dir, "/sys/fs/cgroup/agents");
  EXPECT_EQ(ChooseHierarchy(fs, l, "memory"), Hierarchy::kV2);
  EXPECT_EQ(ChooseHierarchy(fs, l, "pids"), Hierarchy::kV2);
  EXPECT_EQ(ChooseHierarchy(fs, l, "io"), Hierarchy::kNone);  // listed, not enabled for children
  EXPECT_EQ(ChooseHierarchy(fs, l, "hugetlb"), Hierarchy::kNone);
}

TEST_F(PureV2, ControllersNotEnabledAndNotRootAreNotOffered) {
  root_.Put("/sys/fs/cgroup/agents/cgroup.subtree_control", "");
  CgroupFs fs(root_.root());
  CgroupLayout l = DiscoverCgroupLayout(fs);
  EXPECT_EQ(ChooseHierarchy(fs, l, "memory"), Hierarchy::kNone);
  auto cg = SandboxCgroup::Create(fs, l, AllLimits(), "agentbox-1-2-3-x");
  ASSERT_FALSE(cg.ok());
  EXPECT_NE(cg.status().message().find("memory"), std::string::npos);
  EXPECT_FALSE(root_.Has("/sys/fs/cgroup/agents/agentbox-1-2-3-x"));
}

TEST_F(PureV2, WritesLimitsAndRemovesTheCgroup) {
  CgroupFs fs(root_.root());
  CgroupLayout l = DiscoverCgroupLayout(fs);
  root_.Dir("/sys/fs/cgroup/agents/agentbox-1-2-3-x");  // pre-existing name: mkdir fails
  EXPECT_FALSE(SandboxCgroup::Create(fs, l, AllLimits(), "agentbox-1-2-3-x").ok());
  fs::remove(root_.root() + "/sys/fs/cgroup/agents/agentbox-1-2-3-x");

  const std::string dir = "/sys/fs/cgroup/agents/agentbox-1-2-3-y";
  {
    auto cg = SandboxCgroup::Create(fs, l, AllLimits(), "agentbox-1-2-3-y");
    ASSERT_TRUE(cg.ok()) << cg.status().ToString();
    EXPECT_GE((*cg)->v2_fd(), 0);
    EXPECT_FALSE((*cg)->NeedsAttach());
    EXPECT_EQ((*cg)->Mechanism(), "cgroup-v2");
    EXPECT_EQ(root_.Get(dir + "/memory.max"), "67108864");
    EXPECT_EQ(root_.Get(dir + "/memory.low"), "33554432");
    EXPECT_EQ(root_.Get(dir + "/cpu.max"), "50000 100000");
    EXPECT_EQ(root_.Get(dir + "/cpu.weight"), "200");
    EXPECT_EQ(root_.Get(dir + "/pids.max"), "100");
    EXPECT_FALSE(root_.Has(dir + "/memory.swap.max"));  // no swap accounting: nothing written

    root_.Put(dir + "/memory.events", "low 0\nhigh 0\nmax 40\noom 1\noom_kill 1\n");
    root_.Put(dir + "/memory.peak", "67100000\n");
    root_.Put(dir + "/pids.peak", "17\n");
    root_.Put(dir + "/cpu.stat", "usage_usec 3000\nuser_usec 2000\nsystem_usec 1000\n");
    CgroupStats st = (*cg)->ReadStats();
    EXPECT_TRUE(st.oom_counter);
    EXPECT_EQ(st.oom_kills, 1u);
    EXPECT_EQ(st.peak_memory_bytes, 67100000u);
    EXPECT_EQ(st.peak_processes, 17u);
    EXPECT_EQ(st.cpu_user_us, 2000u);
    EXPECT_EQ(st.cpu_sys_us, 1000u);
    (*cg)->KillAll();
    EXPECT_EQ(root_.Get(dir + "/cgroup.kill"), "1");
  }
  EXPECT_FALSE(root_.Has(dir)) << "the cgroup outlived its owner";
}

TEST_F(PureV2, TheMemoryLimitChangesInPlace) {
  CgroupFs fs(root_.root());
  CgroupLayout l = DiscoverCgroupLayout(fs);
  auto cg = SandboxCgroup::Create(fs, l, AllLimits(), "agentbox-1-2-3-m");
  ASSERT_TRUE(cg.ok()) << cg.status().ToString();
  ASSERT_TRUE((*cg)->SetMemoryMax(128ull << 20).ok());
  EXPECT_EQ(root_.Get("/sys/fs/cgroup/agents/agentbox-1-2-3-m/memory.max"), "134217728");
  const auto& applied = (*cg)->applied();
  EXPECT_NE(std::find(applied.begin(), applied.end(), "memory.max=134217728"), applied.end());
  EXPECT_EQ(std::find(applied.begin(), applied.end(), "memory.max=67108864"), applied.end());

  ResourceLimits pids_only;
  pids_only.pids_max = 10;
  auto no_memory = SandboxCgroup::Create(fs, l, pids_only, "agentbox-1-2-3-n");
  ASSERT_TRUE(no_memory.ok());
  Status s = (*no_memory)->SetMemoryMax(128ull << 20);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no memory controller"), std::string::npos) << s.ToString();
}

TEST_F(PureV2, RootCgroupEnablesControllersForChildren) {
  root_.Put("/proc/self/cgroup", "0::/\n");
  root_.Put("/sys/fs/cgroup/cgroup.controllers", "memory pids\n");
  root_.Put("/sys/fs/cgroup/cgroup.subtree_control", "");
  CgroupFs fs(root_.root());
  CgroupLayout l = DiscoverCgroupLayout(fs);
  EXPECT_TRUE(l.v2_is_root);
  ResourceLimits lim;
  lim.pids_max = 5;
  auto cg = SandboxCgroup::Create(fs, l, lim, "agentbox-1-2-3-r");
  ASSERT_TRUE(cg.ok()) << cg.status().ToString();
  EXPECT_EQ(root_.Get("/sys/fs/cgroup/cgroup.subtree_control"), "+pids");
  EXPECT_EQ(root_.Get("/sys/fs/cgroup/agentbox-1-2-3-r/pids.max"), "5");
}

// ------------------------------------------------------------------ hybrid

class Hybrid : public ::testing::Test {
 protected:
  void SetUp() override {
    root_.Put("/proc/self/mountinfo", kHybridMountinfo);
    root_.Put("/proc/self/cgroup", kHybridSelf);
    root_.Put("/sys/fs/cgroup/unified/cgroup.controllers", "");
    root_.Put("/sys/fs/cgroup/unified/cgroup.subtree_control", "");
    root_.Dir("/sys/fs/cgroup/memory/process_api/abc");
    root_.Dir("/sys/fs/cgroup/pids");
    root_.Dir("/sys/fs/cgroup/cpu");
    root_.Dir("/sys/fs/cgroup/cpuacct");
  }
  FakeRoot root_;
};

TEST_F(Hybrid, V1ControllersV2ForPlacement) {
  CgroupFs fs(root_.root());
  CgroupLayout l = DiscoverCgroupLayout(fs);
  EXPECT_EQ(ChooseHierarchy(fs, l, "memory"), Hierarchy::kV1);
  EXPECT_EQ(ChooseHierarchy(fs, l, "pids"), Hierarchy::kV1);
  EXPECT_EQ(ChooseHierarchy(fs, l, "cpu"), Hierarchy::kV1);

  const std::string name = "agentbox-1-2-3-h";
  const std::string mem = "/sys/fs/cgroup/memory/process_api/abc/" + name;
  {
    auto cg = SandboxCgroup::Create(fs, l, AllLimits(), name);
    ASSERT_TRUE(cg.ok()) << cg.status().ToString();
    EXPECT_TRUE((*cg)->NeedsAttach());
    EXPECT_GE((*cg)->v2_fd(), 0);  // the empty v2 hierarchy still places and kills
    EXPECT_EQ((*cg)->Mechanism(), "cgroup-v1+v2");
    EXPECT_EQ(root_.Get(mem + "/memory.limit_in_bytes"), "67108864");
    EXPECT_EQ(root_.Get(mem + "/memory.soft_limit_in_bytes"), "33554432");
    EXPECT_EQ(root_.Get("/sys/fs/cgroup/pids/" + name + "/pids.max"), "100");
    EXPECT_EQ(root_.Get("/sys/fs/cgroup/cpu/" + name + "/cpu.cfs_quota_us"), "50000");
    EXPECT_EQ(root_.Get("/sys/fs/cgroup/cpu/" + name + "/cpu.cfs_period_us"), "100000");
    EXPECT_EQ(root_.Get("/sys/fs/cgroup/cpu/" + name + "/cpu.shares"), "2048");
    EXPECT_TRUE(root_.Has("/sys/fs/cgroup/cpuacct/" + name));
    EXPECT_TRUE(root_.Has("/sys/fs/cgroup/unified/" + name));

    // The runner moves itself: one `tasks` file per v1 cgroup, opened here.
    root_.Put(mem + "/tasks", "");
    root_.Put("/sys/fs/cgroup/pids/" + name + "/tasks", "");
    root_.Put("/sys/fs/cgroup/cpu/" + name + "/tasks", "");
    root_.Put("/sys/fs/cgroup/cpuacct/" + name + "/tasks", "");
    auto files = (*cg)->OpenTaskFiles();
    ASSERT_TRUE(files.ok()) << files.status().ToString();
    EXPECT_EQ(files->size(), 4u);
    for (const auto& fd : *files) ASSERT_EQ(write(fd.get(), "0", 1), 1);
    EXPECT_EQ(root_.Get(mem + "/tasks"), "0");
    EXPECT_EQ(root_.Get("/sys/fs/cgroup/pids/" + name + "/tasks"), "0");

    root_.Put(mem + "/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n");
    root_.Put(mem + "/memory.failcnt", "120\n");
    root_.Put(mem + "/memory.max_usage_in_bytes", "67000000\n");
    root_.Put("/sys/fs/cgroup/cpuacct/" + name + "/cpuacct.usage_user", "5000000\n");
    root_.Put("/sys/fs/cgroup/cpuacct/" + name + "/cpuacct.usage_sys", "1000000\n");
    CgroupStats st = (*cg)->ReadStats();
    EXPECT_EQ(st.oom_kills, 3u);
    EXPECT_EQ(st.memory_failcnt, 120u);
    EXPECT_EQ(st.peak_memory_bytes, 67000000u);
    EXPECT_EQ(st.cpu_user_us, 5000u);
    EXPECT_EQ(st.cpu_sys_us, 1000u);
  }
  EXPECT_FALSE(root_.Has(mem));
  EXPECT_FALSE(root_.Has("/sys/fs/cgroup/pids/" + name));
  EXPECT_FALSE(root_.Has("/sys/fs/cgroup/cpu/" + name));
  EXPECT_FALSE(root_.Has("/sys/fs/cgroup/cpuacct/" + name));
  EXPECT_FALSE(root_.Has("/sys/fs/cgroup/unified/" + name));
}

// v1: memory <= memory+swap at every step, whichever way the limit moves.
TEST_F(Hybrid, TheMemoryLimitMovesWithItsSwapLimit) {
  CgroupFs fs(root_.root());
  CgroupLayout l = DiscoverCgroupLayout(fs);
  const std::string name = "agentbox-1-2-3-s";
  const std::string mem = "/sys/fs/cgroup/memory/process_api/abc/" + name;
  auto cg = SandboxCgroup::Create(fs, l, AllLimits(), name);
  ASSERT_TRUE(cg.ok()) << cg.status().ToString();
  root_.Put(mem + "/memory.memsw.limit_in_bytes", "67108864");
  ASSERT_TRUE((*cg)->SetMemoryMax(256ull << 20).ok());
  EXPECT_EQ(root_.Get(mem + "/memory.limit_in_bytes"), "268435456");
  EXPECT_EQ(root_.Get(mem + "/memory.memsw.limit_in_bytes"), "268435456");
  ASSERT_TRUE((*cg)->SetMemoryMax(32ull << 20).ok());
  EXPECT_EQ(root_.Get(mem + "/memory.limit_in_bytes"), "33554432");
  EXPECT_EQ(root_.Get(mem + "/memory.memsw.limit_in_bytes"), "33554432");
}

TEST_F(Hybrid, OnlyTheControllersAskedFor) {
  CgroupFs fs(root_.root());
  CgroupLayout l = DiscoverCgroupLayout(fs);
  ResourceLimits lim;
  lim.pids_max = 10;
  auto cg = SandboxCgroup::Create(fs, l, lim, "agentbox-1-2-3-p");
  ASSERT_TRUE(cg.ok());
  EXPECT_TRUE(root_.Has("/sys/fs/cgroup/pids/agentbox-1-2-3-p"));
  EXPECT_FALSE(root_.Has("/sys/fs/cgroup/memory/process_api/abc/agentbox-1-2-3-p"));
  EXPECT_FALSE(root_.Has("/sys/fs/cgroup/cpu/agentbox-1-2-3-p"));
}

TEST_F(Hybrid, StaleCgroupsOfDeadSupervisorsAreRemovedLiveOnesKept) {
  CgroupFs fs(root_.root());
  CgroupLayout l = DiscoverCgroupLayout(fs);
  // pid 100 alive with start time 555; pid 200 gone; pid 300 reused (other start time).
  root_.Put("/proc/100/stat", "100 (agentbox) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 555 0 0\n");
  root_.Put("/proc/300/stat", "300 (some (odd) name) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 999 0 0\n");
  const std::string live = "agentbox-4026531836-100-555-aaaa";
  const std::string dead = "agentbox-4026531836-200-556-bbbb";
  const std::string reused = "agentbox-4026531836-300-557-cccc";
  const std::string other_ns = "agentbox-4026532000-200-556-dddd";
  for (const auto& n : {live, dead, reused, other_ns}) {
    root_.Dir("/sys/fs/cgroup/pids/" + n);
    root_.Dir("/sys/fs/cgroup/unified/" + n);
  }
  root_.Dir("/sys/fs/cgroup/pids/not-ours");
  auto removed = CollectStaleCgroups(fs, l);
  EXPECT_EQ(removed.size(), 4u);
  for (const char* parent : {"/sys/fs/cgroup/pids/", "/sys/fs/cgroup/unified/"}) {
    EXPECT_TRUE(root_.Has(parent + live)) << parent;
    EXPECT_FALSE(root_.Has(parent + dead)) << parent;
    EXPECT_FALSE(root_.Has(parent + reused)) << parent;
    EXPECT_TRUE(root_.Has(parent + other_ns)) << parent;
  }
  EXPECT_TRUE(root_.Has("/sys/fs/cgroup/pids/not-ours"));
}

TEST_F(Hybrid, StaleCgroupsAreToldByTheirOwnerTagNotTheirName) {
  CgroupFs fs(root_.root());
  CgroupLayout l = DiscoverCgroupLayout(fs);
  root_.Put("/proc/100/stat", "100 (agentbox) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 555 0 0\n");
  const std::map<std::string, std::string> owners = {{"agentbox-live", "4026531836-100-555"},
                                                     {"agentbox-dead", "4026531836-200-556"},
                                                     {"agentbox-otherns", "4026532000-200-556"},
                                                     {"agentbox-untagged", ""}};
  for (const auto& [n, owner] : owners) {
    root_.Dir("/sys/fs/cgroup/pids/" + n);
    if (!owner.empty()) {
      ASSERT_TRUE(fs.SetTag("/sys/fs/cgroup/pids/" + n, "user.agentbox.owner", owner).ok());
    }
  }
  auto removed = CollectStaleCgroups(fs, l);
  EXPECT_EQ(removed, std::vector<std::string>{"/sys/fs/cgroup/pids/agentbox-dead"});
  EXPECT_TRUE(root_.Has("/sys/fs/cgroup/pids/agentbox-live"));
  EXPECT_TRUE(root_.Has("/sys/fs/cgroup/pids/agentbox-otherns"));
  EXPECT_TRUE(root_.Has("/sys/fs/cgroup/pids/agentbox-untagged"));  // its owner unknown: never judged
}

TEST_F(Hybrid, CreateTagsEachDirectoryWithItsOwner) {
  CgroupFs fs(root_.root());
  CgroupLayout l = DiscoverCgroupLayout(fs);
  ResourceLimits lim;
  lim.pids_max = 5;
  auto cg = SandboxCgroup::Create(fs, l, lim, "agentbox-tagged");
  ASSERT_TRUE(cg.ok()) << cg.status().ToString();
  auto tag = fs.Tag("/sys/fs/cgroup/pids/agentbox-tagged", "user.agentbox.owner");
  ASSERT_TRUE(tag.has_value());
  EXPECT_EQ(*tag, CgroupOwner(fs));
  EXPECT_NE(tag->find("-" + std::to_string(getpid()) + "-"), std::string::npos) << *tag;
}

TEST(CgroupName, NamesNothingOfTheHost) {
  std::string n = SandboxCgroupName();
  EXPECT_EQ(n.rfind("agentbox-", 0), 0u);
  EXPECT_EQ(n.size(), std::string("agentbox-").size() + 16) << n;
  EXPECT_EQ(n.find("-" + std::to_string(getpid())), std::string::npos) << n;
  EXPECT_NE(SandboxCgroupName(), n);
}

}  // namespace
}  // namespace agentbox::linux
