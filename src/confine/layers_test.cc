// Planning of the Landlock and seccomp layers against fake hosts.
#include "confine/layers.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "agentbox/confine.h"
#include "confine/fake_host.h"
#include "linux/compat.h"

namespace agentbox {
namespace {

using testing::FacetNamed;
using testing::Rule;

HostCaps Host(int landlock_abi, bool seccomp = true) { return testing::FakeHost(true, landlock_abi, seccomp); }

Invocation ProjectRootInv() { return testing::FakeInvocation("/home/u/proj"); }

Plan PlanFor(Mode mode, int abi) {
  auto c = Confine({"true"}, PresetFor(mode), Host(abi), ProjectRootInv());
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? c->plan : Plan{};
}

constexpr std::uint64_t kWriteFile = LANDLOCK_ACCESS_FS_WRITE_FILE;
constexpr std::uint64_t kMakeReg = LANDLOCK_ACCESS_FS_MAKE_REG;

TEST(LandlockPlan, RulesMirrorTheMountsInWorkspaceWrite) {
  Plan p = PlanFor(Mode::kWorkspaceWrite, 7);
  ASSERT_EQ(p.landlock.abi, 7);
  ASSERT_NE(Rule(p, "/"), nullptr);
  EXPECT_EQ(Rule(p, "/")->access, LANDLOCK_ACCESS_FS_READ_DIR) << "the root: listing only";
  ASSERT_NE(Rule(p, "/usr"), nullptr);
  EXPECT_EQ(Rule(p, "/usr")->access, LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR |
                                         LANDLOCK_ACCESS_FS_EXECUTE);
  EXPECT_TRUE(Rule(p, "/usr")->optional);
  for (const char* rw : {"/home/u/proj", "/tmp", "/home/u", "/dev/shm"}) {
    ASSERT_NE(Rule(p, rw), nullptr) << rw;
    EXPECT_TRUE(Rule(p, rw)->access & kMakeReg) << rw;
    EXPECT_FALSE(Rule(p, rw)->access & LANDLOCK_ACCESS_FS_MAKE_CHAR) << rw;
  }
  ASSERT_NE(Rule(p, "/dev/null"), nullptr);
  EXPECT_TRUE(Rule(p, "/dev/null")->access & LANDLOCK_ACCESS_FS_IOCTL_DEV);
  EXPECT_TRUE(Rule(p, "/dev/pts")->access & LANDLOCK_ACCESS_FS_IOCTL_DEV);
  EXPECT_EQ(Rule(p, "/dev")->access, LANDLOCK_ACCESS_FS_READ_DIR);
  EXPECT_TRUE(Rule(p, "/proc")->access & kWriteFile);
  EXPECT_FALSE(Rule(p, "/proc")->access & LANDLOCK_ACCESS_FS_EXECUTE);
  // Nothing else: no rule for a path the mount plan does not mount.
  for (const auto& r : p.landlock.rules) {
    bool mounted = std::any_of(p.mounts.begin(), p.mounts.end(), [&](const MountOp& m) { return m.target == r.path; });
    EXPECT_TRUE(mounted) << r.path;
  }
  EXPECT_EQ(p.landlock.scoped, LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL);
  EXPECT_TRUE(p.landlock.left_out.empty());
}

TEST(LandlockPlan, ReadOnlyModeGivesTheWorkspaceNoWriteRights) {
  Plan p = PlanFor(Mode::kReadOnly, 7);
  ASSERT_NE(Rule(p, "/home/u/proj"), nullptr);
  EXPECT_FALSE(Rule(p, "/home/u/proj")->access & (kWriteFile | kMakeReg));
  EXPECT_TRUE(Rule(p, "/tmp")->access & kMakeReg) << "/tmp stays writable";
}

TEST(LandlockPlan, AdaptsToEachAbi) {
  Policy partial = PresetFor(Mode::kWorkspaceWrite);
  partial.sandbox.require = Requirement::kPartial;
  for (int abi = 1; abi <= 7; ++abi) {
    auto c = Confine({"true"}, PresetFor(Mode::kWorkspaceWrite), Host(abi), ProjectRootInv());
    if (abi < kMinLandlockAbi) {
      EXPECT_FALSE(c.ok()) << "require full refuses without the layer, ABI " << abi;
      auto relaxed = Confine({"true"}, partial, Host(abi), ProjectRootInv());
      ASSERT_TRUE(relaxed.ok());
      EXPECT_EQ(relaxed->plan.landlock.abi, 0) << abi;
      continue;
    }
    Plan p = PlanFor(Mode::kWorkspaceWrite, abi);
    ASSERT_TRUE(c.ok()) << abi;
    EXPECT_EQ(p.landlock.abi, abi);
    const std::uint64_t h = p.landlock.handled_fs;
    EXPECT_TRUE(h & LANDLOCK_ACCESS_FS_REFER) << abi;
    EXPECT_EQ(bool(h & LANDLOCK_ACCESS_FS_TRUNCATE), abi >= 3) << abi;
    EXPECT_EQ(bool(h & LANDLOCK_ACCESS_FS_IOCTL_DEV), abi >= 5) << abi;
    EXPECT_EQ(p.landlock.scoped != 0, abi >= 6) << abi;
    for (const auto& r : p.landlock.rules) EXPECT_EQ(r.access & ~h, 0u) << r.path << " at ABI " << abi;
    EXPECT_EQ(p.landlock.left_out.size(), abi < 3 ? 3u : abi < 5 ? 2u : abi < 6 ? 1u : 0u) << abi;
    const FacetReport* fs = FacetNamed(c->enforcement, "filesystem");
    EXPECT_NE(std::find(fs->mechanisms.begin(), fs->mechanisms.end(), "landlock-abi-" + std::to_string(abi)),
              fs->mechanisms.end());
  }
}

TEST(LandlockPlan, NoLandlockIsMissingFromTheFilesystemFacet) {
  Policy partial = PresetFor(Mode::kWorkspaceWrite);
  partial.sandbox.require = Requirement::kPartial;
  for (int abi : {0, 1}) {
    EnforcementReport r = AssessEnforcement(partial, Host(abi));
    EXPECT_EQ(FacetNamed(r, "filesystem")->level, Level::kPartial) << abi;
    ASSERT_FALSE(r.missing.empty());
    EXPECT_EQ(r.missing.front().facet, "filesystem");
    EXPECT_NE(r.missing.front().reason.find("Landlock"), std::string::npos);
  }
}

TEST(SeccompPlan, DeniesTheListedSyscallsAndClone3GetsEnosys) {
  Plan p = PlanFor(Mode::kWorkspaceWrite, 7);
  ASSERT_TRUE(p.seccomp.enabled);
  EXPECT_TRUE(p.seccomp.refuse_foreign_arches);
  auto find = [&](const std::string& name) {
    return std::find_if(p.seccomp.rules.begin(), p.seccomp.rules.end(),
                        [&](const SeccompRule& r) { return r.syscall == name; });
  };
  for (const char* s : {"ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root",
                        "move_mount", "fsopen", "fsmount", "fsconfig", "open_tree", "mount_setattr", "unshare",
                        "setns", "bpf", "userfaultfd", "perf_event_open", "keyctl", "add_key", "request_key",
                        "init_module", "finit_module", "delete_module", "kexec_load", "reboot", "swapon",
                        "swapoff", "settimeofday", "clock_settime", "io_uring_setup", "io_uring_enter",
                        "io_uring_register", "acct", "quotactl", "name_to_handle_at", "open_by_handle_at"}) {
    auto it = find(s);
    ASSERT_NE(it, p.seccomp.rules.end()) << s;
    EXPECT_EQ(it->action, SeccompAction::kNotifyEperm) << s;
    EXPECT_EQ(it->when.kind, SeccompArgCheck::Kind::kAlways) << s;
  }
  EXPECT_EQ(find("clone3")->action, SeccompAction::kErrnoEnosys);
  EXPECT_EQ(find("clone")->when.kind, SeccompArgCheck::Kind::kAnyBitSet);
  EXPECT_TRUE(find("clone")->when.mask & 0x10000000) << "CLONE_NEWUSER";
  EXPECT_EQ(find("ioctl")->when.kind, SeccompArgCheck::Kind::kLow32Equals);
  EXPECT_TRUE(find("personality")->when.has_except);
  EXPECT_EQ(find("socket")->when.values, (std::vector<std::uint64_t>{1, 2, 10, 16})) << "unix, inet, inet6, netlink";
}

TEST(SeccompPlan, HostWithoutSeccompLowersTheSyscallsFacet) {
  Policy partial = PresetFor(Mode::kWorkspaceWrite);
  partial.sandbox.require = Requirement::kPartial;
  EnforcementReport r = AssessEnforcement(partial, Host(7, /*seccomp=*/false));
  const FacetReport* sys = FacetNamed(r, "syscalls");
  EXPECT_TRUE(sys->requested);
  EXPECT_EQ(sys->level, Level::kPartial);
  EXPECT_EQ(r.level, Level::kPartial);
  EXPECT_FALSE(Confine({"true"}, PresetFor(Mode::kWorkspaceWrite), Host(7, false), ProjectRootInv()).ok());
  auto c = Confine({"true"}, partial, Host(7, false), ProjectRootInv());
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->plan.seccomp.enabled);

  EnforcementReport full = AssessEnforcement(PresetFor(Mode::kWorkspaceWrite), Host(7));
  EXPECT_EQ(FacetNamed(full, "syscalls")->level, Level::kFull);
  EXPECT_EQ(FacetNamed(full, "syscalls")->mechanisms,
            (std::vector<std::string>{"seccomp-bpf", "no_new_privs", "capabilities-dropped"}));
}

TEST(LayersPlan, SurviveTheJsonRoundTrip) {
  Plan p = PlanFor(Mode::kWorkspaceWrite, 5);
  auto back = PlanFromJson(PlanToJson(p));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->landlock.abi, 5);
  EXPECT_EQ(back->landlock.handled_fs, p.landlock.handled_fs);
  ASSERT_EQ(back->landlock.rules.size(), p.landlock.rules.size());
  EXPECT_EQ(back->landlock.rules[0].access, p.landlock.rules[0].access);
  ASSERT_EQ(back->seccomp.rules.size(), p.seccomp.rules.size());
  for (size_t i = 0; i < p.seccomp.rules.size(); ++i) {
    EXPECT_EQ(Describe(back->seccomp.rules[i]), Describe(p.seccomp.rules[i]));
  }
}


// A ceiling tree of on_violation.max_grant outside every mounted tree: an
// empty directory on the root tmpfs, with a Landlock rule as the list says.
TEST(Landlock, CeilingTreesGetADirectoryAndARule) {
  Policy policy = PresetFor(Mode::kWorkspaceWrite);
  policy.on_violation.escalation = Escalation::kOneTimeApproval;
  policy.on_violation.max_grant.filesystem_read = {"/srv/data", "/usr/share/doc", "/home/u/proj/sub"};
  policy.on_violation.max_grant.filesystem_write = {"/srv/out", "/srv/data"};
  auto c = Confine({"true"}, policy, Host(6), ProjectRootInv());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const Plan& plan = c->plan;
  auto dirs = std::count_if(plan.mounts.begin(), plan.mounts.end(), [](const MountOp& m) { return m.kind == MountKind::kDir; });
  EXPECT_EQ(dirs, 2);  // /srv/data (writable wins) and /srv/out; the rest are inside mounted trees
  for (const auto& m : plan.mounts) {
    if (m.kind != MountKind::kDir) continue;
    EXPECT_TRUE(m.target == "/srv/data" || m.target == "/srv/out") << m.target;
    EXPECT_FALSE(m.read_only) << m.target;
  }
  ASSERT_NE(Rule(plan, "/srv/out"), nullptr);
  EXPECT_NE(Rule(plan, "/srv/out")->access & kWriteFile, 0u);
  EXPECT_EQ(Rule(plan, "/usr/share/doc"), nullptr);
  EXPECT_TRUE(LandlockCovers(plan.landlock, "/srv/data/a/b", true));
  // Below a ceiling: covered; the ceiling itself (a mount there hides the
  // ruled directory) and anything beside it: not.
  EXPECT_TRUE(LandlockCovers(plan.landlock, "/srv/out/x", true));
  EXPECT_TRUE(LandlockCovers(plan.landlock, "/srv/data/a/b", false));
  EXPECT_FALSE(LandlockCovers(plan.landlock, "/srv/out", false));
  EXPECT_FALSE(LandlockCovers(plan.landlock, "/srv/other", false));
  EXPECT_FALSE(LandlockCovers(plan.landlock, "/srv", false));
  // Inside read-only /usr: read yes, write no.
  EXPECT_TRUE(LandlockCovers(plan.landlock, "/usr/share/doc", false));
  EXPECT_FALSE(LandlockCovers(plan.landlock, "/usr/share/doc", true));

  Policy read_only = policy;
  read_only.on_violation.max_grant.filesystem_write.clear();
  auto r = Confine({"true"}, read_only, Host(6), ProjectRootInv());
  ASSERT_TRUE(r.ok());
  ASSERT_NE(Rule(r->plan, "/srv/data"), nullptr);
  EXPECT_EQ(Rule(r->plan, "/srv/data")->access & kWriteFile, 0u);
  EXPECT_NE(Rule(r->plan, "/srv/data")->access & LANDLOCK_ACCESS_FS_READ_FILE, 0u);
  EXPECT_TRUE(LandlockCovers(r->plan.landlock, "/srv/data/x", false));
  EXPECT_FALSE(LandlockCovers(r->plan.landlock, "/srv/data/x", true));

  // No escalation: no directory, no rule.
  Policy none = policy;
  none.on_violation.escalation = Escalation::kDeny;
  auto n = Confine({"true"}, none, Host(6), ProjectRootInv());
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(Rule(n->plan, "/srv/data"), nullptr);
  EXPECT_FALSE(LandlockCovers(n->plan.landlock, "/srv/data/x", false));
}

TEST(Landlock, CoversAddsRightsOverAncestors) {
  LandlockPlan ll;
  ll.abi = 6;
  ll.handled_fs = ~std::uint64_t{0};
  ll.rules.push_back({"/a", LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR, false, ""});
  ll.rules.push_back({"/a/b", LANDLOCK_ACCESS_FS_WRITE_FILE, false, ""});
  EXPECT_TRUE(LandlockCovers(ll, "/a/b/c", true));
  EXPECT_FALSE(LandlockCovers(ll, "/a/bc", true));  // a sibling by prefix only
  EXPECT_TRUE(LandlockCovers(ll, "/a/bc", false));
  EXPECT_FALSE(LandlockCovers(ll, "/a", false));
  EXPECT_TRUE(LandlockCovers(LandlockPlan{}, "/anything", true));  // no Landlock layer
}

}  // namespace
}  // namespace agentbox
