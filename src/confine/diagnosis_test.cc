// The doctor against fake hosts: one test per cause, each from the raw facts
// the probe records, and a healthy host with nothing to say.
#include "agentbox/diagnosis.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "agentbox/confine.h"
#include "confine/fake_host.h"

namespace agentbox {
namespace {

HostCaps Healthy() {
  HostCaps h = testing::FakeHost();
  h.max_user_namespaces = 15000;
  h.unprivileged_userns_clone = 1;
  h.apparmor_restrict_userns = 0;
  h.unshare_errno = 0;
  h.proc_mount_errno = 0;
  h.loopback_errno = 0;
  h.lsm = "lockdown,capability,landlock,yama,apparmor\n";
  return h;
}

// The one diagnosis with `cause`, failing the test when there is not exactly one.
Diagnosis Only(const HostCaps& h, const std::string& cause) {
  Diagnosis found;
  int n = 0;
  for (const auto& d : Diagnose(h)) {
    if (d.cause == cause) {
      found = d;
      ++n;
    }
  }
  EXPECT_EQ(n, 1) << cause;
  EXPECT_FALSE(found.fix.empty()) << cause;
  EXPECT_FALSE(found.detail.empty()) << cause;
  return found;
}

bool Has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Diagnose, HealthyHostHasNothingToSay) {
  EXPECT_TRUE(Diagnose(Healthy()).empty());
}

TEST(Diagnose, KernelWithoutUserNamespaces) {
  HostCaps h = Healthy();
  h.userns_in_kernel = h.user_namespaces = false;
  EXPECT_EQ(Only(h, "kernel-no-userns").facet, "user-namespaces");
}

TEST(Diagnose, MaxUserNamespacesZero) {
  HostCaps h = Healthy();
  h.user_namespaces = false;
  h.max_user_namespaces = 0;
  Diagnosis d = Only(h, "max-user-namespaces-zero");
  EXPECT_TRUE(Has(d.fix, "sysctl -w user.max_user_namespaces=15000")) << d.fix;
  EXPECT_TRUE(Has(d.fix, "/etc/sysctl.d/")) << d.fix;
}

TEST(Diagnose, UnprivilegedUsernsCloneOff) {
  HostCaps h = Healthy();
  h.user_namespaces = false;
  h.unprivileged_userns_clone = 0;
  Diagnosis d = Only(h, "unprivileged-userns-clone-off");
  EXPECT_TRUE(Has(d.fix, "kernel.unprivileged_userns_clone=1")) << d.fix;
  h.uid = 0;  // root is not subject to it
  for (const auto& x : Diagnose(h)) EXPECT_NE(x.cause, "unprivileged-userns-clone-off");
}

TEST(Diagnose, AppArmorRestrictionNamesTheProfileAndTheParser) {
  HostCaps h = Healthy();
  h.user_namespaces = false;
  h.apparmor_restrict_userns = 1;
  Diagnosis d = Only(h, "apparmor-userns-restricted");
  EXPECT_TRUE(Has(d.fix, "packaging/apparmor/agentbox")) << d.fix;
  EXPECT_TRUE(Has(d.fix, "apparmor_parser -r /etc/apparmor.d/agentbox")) << d.fix;
  // With agentbox's profile loaded the probe could use a capability in a new
  // user namespace: nothing left to say.
  h.user_namespaces = true;
  h.userns_caps_errno = 0;
  EXPECT_TRUE(Diagnose(h).empty());
}

TEST(Diagnose, ContainerSeccompRefusesUnshare) {
  HostCaps h = Healthy();
  h.user_namespaces = false;
  h.seccomp_mode = 2;
  h.unshare_errno = EPERM;
  Diagnosis d = Only(h, "seccomp-refuses-unshare");
  EXPECT_TRUE(Has(d.detail, "EPERM")) << d.detail;
  EXPECT_TRUE(Has(d.fix, "seccomp=")) << d.fix;
  // The same errno without a filter on us is not blamed on seccomp.
  h.seccomp_mode = 0;
  for (const auto& x : Diagnose(h)) EXPECT_NE(x.cause, "seccomp-refuses-unshare");
  EXPECT_EQ(Only(h, "unshare-refused").facet, "user-namespaces");
}

TEST(Diagnose, UserNamespaceCountUsedUp) {
  HostCaps h = Healthy();
  h.user_namespaces = false;
  h.unshare_errno = ENOSPC;
  EXPECT_TRUE(Has(Only(h, "user-namespace-limit-reached").fix, "user.max_user_namespaces"));
}

TEST(Diagnose, UserNamespacesNestedTooDeep) {
  HostCaps h = Healthy();
  h.user_namespaces = false;
  h.unshare_errno = EUSERS;
  EXPECT_EQ(Only(h, "user-namespace-nesting-too-deep").facet, "user-namespaces");
}

TEST(Diagnose, NoSetgroups) {
  HostCaps h = Healthy();
  h.user_namespaces = false;
  h.setgroups_file = false;
  EXPECT_EQ(Only(h, "no-setgroups").facet, "user-namespaces");
}

TEST(Diagnose, UnexplainedUnavailabilityStillSaysWhy) {
  HostCaps h = Healthy();
  h.user_namespaces = false;
  h.userns_reason = "something new";
  EXPECT_EQ(Only(h, "userns-unavailable").detail, "something new");
}

TEST(Diagnose, ProcOvermountedByTheRealMountOrByMountinfo) {
  HostCaps h = Healthy();
  h.proc_mount_errno = EPERM;
  h.proc_overmounts = {"/proc/kcore", "/proc/keys"};
  Diagnosis d = Only(h, "proc-overmounted");
  EXPECT_EQ(d.facet, "proc");
  EXPECT_TRUE(Has(d.detail, "/proc/kcore, /proc/keys")) << d.detail;
  EXPECT_TRUE(Has(d.fix, "unmask")) << d.fix;
  // A quick probe only read mountinfo.
  h.proc_mount_errno = -1;
  h.proc_fully_visible = false;
  Only(h, "proc-overmounted");
  // The real mount worked: mountinfo's guess is overruled.
  h.proc_mount_errno = 0;
  for (const auto& x : Diagnose(h)) EXPECT_NE(x.cause, "proc-overmounted");
}

TEST(Diagnose, LoopbackRefusedInANewNetworkNamespace) {
  HostCaps h = Healthy();
  h.loopback_errno = EPERM;
  Diagnosis d = Only(h, "netlink-lo-refused");
  EXPECT_EQ(d.facet, "network");
  EXPECT_TRUE(Has(d.fix, "SIOCSIFFLAGS")) << d.fix;
}

TEST(Diagnose, ContainerSeccompRefusesSethostname) {
  HostCaps h = Healthy();
  h.seccomp_mode = 2;
  h.sethostname_errno = EPERM;
  EXPECT_EQ(Only(h, "seccomp-refuses-sethostname").facet, "processes");
}

TEST(Diagnose, TextHasACauseAndAFixLinePerCause) {
  HostCaps h = Healthy();
  h.seccomp_filter = false;
  h.cgroupfs_read_only = true;
  const std::string text = DiagnosisText(Diagnose(h));
  EXPECT_TRUE(Has(text, "  seccomp\n    cause: no-seccomp: ")) << text;
  EXPECT_TRUE(Has(text, "  cgroups\n    cause: cgroupfs-read-only: ")) << text;
  EXPECT_TRUE(Has(text, "\n    fix: set the limits on the container itself")) << text;
  EXPECT_EQ(DiagnosisText({}), "diagnosis: nothing stands in the way\n");
}

TEST(Diagnose, LandlockBuiltInButNotEnabled) {
  HostCaps h = Healthy();
  h.landlock_abi = 0;
  h.landlock_errno = EOPNOTSUPP;
  h.lsm = "lockdown,capability,yama,apparmor\n";
  Diagnosis d = Only(h, "landlock-disabled");
  EXPECT_TRUE(Has(d.fix, "lsm=landlock")) << d.fix;
  EXPECT_TRUE(Has(d.detail, "active LSMs: lockdown,capability,yama,apparmor:")) << d.detail;
}

TEST(Diagnose, LandlockRefusedByAContainerProfile) {
  HostCaps h = Healthy();
  h.landlock_abi = 0;
  h.landlock_errno = ENOSYS;
  h.seccomp_mode = 2;
  Only(h, "seccomp-refuses-landlock");
}

TEST(Diagnose, KernelWithoutLandlock) {
  HostCaps h = Healthy();
  h.landlock_abi = 0;
  h.landlock_errno = ENOSYS;
  h.lsm = "";
  Only(h, "no-landlock");
}

TEST(Diagnose, LandlockAbiTooOld) {
  HostCaps h = Healthy();
  h.landlock_abi = 1;
  EXPECT_TRUE(Has(Only(h, "landlock-abi-too-old").detail, "ABI 1"));
}

TEST(Diagnose, NoSeccomp) {
  HostCaps h = Healthy();
  h.seccomp_filter = false;
  EXPECT_EQ(Only(h, "no-seccomp").facet, "seccomp");
}

TEST(Diagnose, ReadOnlyCgroupfs) {
  HostCaps h = Healthy();
  h.cgroupfs_read_only = true;
  EXPECT_TRUE(Has(Only(h, "cgroupfs-read-only").fix, "--memory"));
}

// The backend follows the same facts, and says why.
TEST(SelectBackend, OvermountedProcMeansLandlockOnlyWithTheReason) {
  HostCaps h = Healthy();
  h.proc_mount_errno = -1;
  h.proc_fully_visible = false;
  h.proc_overmounts = {"/proc/kcore"};
  auto s = SelectBackend(h, BackendChoice::kAuto);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->backend, Backend::kLandlockOnly);
  EXPECT_TRUE(Has(s->why, "/proc cannot be mounted")) << s->why;
  EXPECT_TRUE(Has(s->why, "/proc/kcore")) << s->why;
  auto forced = SelectBackend(h, BackendChoice::kNamespaces);
  ASSERT_FALSE(forced.ok());
  EXPECT_TRUE(Has(forced.status().message(), "/proc/kcore")) << forced.status().message();
  h.proc_mount_errno = 0;  // the real mount worked
  EXPECT_EQ(SelectBackend(h, BackendChoice::kAuto)->backend, Backend::kNamespaces);
}

// ------------------------------------------------------------ PATH under HOME

// PATH as a toolchain user has it (FakeInvocation: HOME /home/u, workspace
// /home/u/proj), HOME itself and a system directory among them.
const std::vector<std::string> kPathDirs = {"/home/u/.pyenv/shims", "/home/u/.cargo/bin", "/usr/bin",
                                            "/home/u/.local/bin",   "/home/u/proj/node_modules/.bin",
                                            "/home/u",              "/home/u/.pyenv/shims"};

HomePathDirs Find(const Policy& pol, const HostCaps& host) {
  auto c = Confine({"true"}, pol, host, testing::FakeInvocation());
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return {};
  return FindHomePathDirs(c->plan, kPathDirs, "/home/u", pol.filesystem.read_only);
}

TEST(HomePathDirs, NamesEachDirectoryUnderTheHiddenHomeAndTheEntriesThatBindThem) {
  const Policy pol = PresetFor(Mode::kWorkspaceWrite);
  HomePathDirs found = Find(pol, Healthy());
  // The workspace's own directory is bound; HOME itself and /usr/bin are not toolchains.
  EXPECT_EQ(found.not_mounted,
            (std::vector<std::string>{"/home/u/.pyenv/shims", "/home/u/.cargo/bin", "/home/u/.local/bin"}));
  std::vector<std::string> want = pol.filesystem.read_only;
  for (const char* e : {"~/.pyenv", "~/.cargo", "~/.local/bin"}) want.push_back(e);
  EXPECT_EQ(found.read_only, want);
  const std::string text = HomePathDirsText(found, "agentbox: ");
  for (const auto& d : found.not_mounted) EXPECT_TRUE(Has(text, d)) << text;
  EXPECT_TRUE(Has(text, "filesystem.read_only: [/usr, ")) << text;
  EXPECT_TRUE(Has(text, ", ~/.pyenv, ~/.cargo, ~/.local/bin]")) << text;
  EXPECT_TRUE(Has(text, "HOME is private")) << text;
  for (size_t at = 0; at < text.size(); at = text.find('\n', at) + 1) {
    EXPECT_EQ(text.compare(at, 10, "agentbox: "), 0) << text.substr(at);
  }
}

TEST(HomePathDirs, DirectoriesTheReadOnlyListCoversAreNotMentioned) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.filesystem.read_only.push_back("~/.pyenv");
  pol.filesystem.read_only.push_back("/home/u/.local/bin");
  HomePathDirs found = Find(pol, Healthy());
  EXPECT_EQ(found.not_mounted, (std::vector<std::string>{"/home/u/.cargo/bin"}));
  ASSERT_FALSE(found.read_only.empty());
  EXPECT_EQ(found.read_only.back(), "~/.cargo");
  EXPECT_EQ(std::count(found.read_only.begin(), found.read_only.end(), "~/.pyenv"), 1);
  pol.filesystem.read_only.push_back("~/.cargo");
  found = Find(pol, Healthy());
  EXPECT_TRUE(found.not_mounted.empty());
  EXPECT_TRUE(found.read_only.empty());
  EXPECT_EQ(HomePathDirsText(found, ""), "");
}

TEST(HomePathDirs, LandlockOnlyGrantsByRuleAlike) {
  HostCaps h = Healthy();
  h.user_namespaces = false;
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.sandbox.require = Requirement::kPartial;
  pol.filesystem.read_only.push_back("~/.cargo");
  HomePathDirs found = Find(pol, h);
  EXPECT_EQ(found.not_mounted, (std::vector<std::string>{"/home/u/.pyenv/shims", "/home/u/.local/bin"}));
}

TEST(HomePathDirs, NothingToSayWithoutConfinementOrWithHomeInTheWorkspace) {
  EXPECT_TRUE(Find(PresetFor(Mode::kDangerFullAccess), Healthy()).not_mounted.empty());
  // HOME inside the workspace: the workspace's bind shows it.
  Invocation inv = testing::FakeInvocation("/home");
  inv.workspace = "/home";
  const Policy pol = PresetFor(Mode::kWorkspaceWrite);
  auto c = Confine({"true"}, pol, Healthy(), inv);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(FindHomePathDirs(c->plan, kPathDirs, "/home/u", pol.filesystem.read_only).not_mounted.empty());
}

TEST(PathInside, ThePlansOwnElseTheHostsWhenPassedElseNone) {
  EnvRules env;
  EXPECT_EQ(PathInside(env, "/home/u/bin:/usr/bin"), "");
  env.pass = {"LANG", "PATH"};
  EXPECT_EQ(PathInside(env, "/home/u/bin:/usr/bin"), "/home/u/bin:/usr/bin");
  env.set = {{"PATH", "/usr/bin"}};
  EXPECT_EQ(PathInside(env, "/home/u/bin:/usr/bin"), "/usr/bin");
  EnvRules all;
  all.pass_all = true;
  EXPECT_EQ(PathInside(all, "/x"), "/x");
}

}  // namespace
}  // namespace agentbox
