// The doctor against fake hosts: one test per cause, each from the raw facts
// the probe records, and a healthy host with nothing to say.
#include "agentbox/diagnosis.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <string>

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

}  // namespace
}  // namespace agentbox
