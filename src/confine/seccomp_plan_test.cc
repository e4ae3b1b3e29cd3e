// Property test of the seccomp plan: whatever the policy and whichever
// backend, every confined plan denies the always-denied syscalls of
// docs/seccomp.md and never lets clone create a namespace.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "agentbox/confine.h"
#include "agentbox/plan.h"
#include "agentbox/policy.h"
#include "confine/fake_host.h"
#include "confine/layers.h"

namespace agentbox {
namespace {

// docs/seccomp.md, "Denied syscalls (always)".
const std::vector<std::string> kAlwaysDenied = {
    "ptrace",        "process_vm_readv", "process_vm_writev", "mount",           "umount2",
    "pivot_root",    "move_mount",       "fsopen",            "fsmount",         "fsconfig",
    "fspick",        "open_tree",        "mount_setattr",     "unshare",         "setns",
    "bpf",           "userfaultfd",      "perf_event_open",   "keyctl",          "add_key",
    "request_key",   "init_module",      "finit_module",      "delete_module",   "kexec_load",
    "kexec_file_load", "reboot",         "swapon",            "swapoff",         "settimeofday",
    "clock_settime", "clock_adjtime",    "adjtimex",          "io_uring_setup",  "io_uring_enter",
    "io_uring_register", "acct",         "quotactl",          "quotactl_fd",     "name_to_handle_at",
    "open_by_handle_at"};

constexpr std::uint64_t kCloneNamespaceFlags =
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000;

// Escalation (policy.h SyscallGrantProblem) keeps its own copy of the
// outright denials: every one of them is classified there, nothing else is,
// and only the debugging group is grantable.
TEST(SeccompPlanTest, GrantableSyscallsAreExactlyTheOutrightDenialsThatStayInside) {
  const SeccompPlan plan = PlanSeccomp(true);
  std::set<std::string> outright;
  for (const auto& r : plan.rules) {
    if (r.action == SeccompAction::kNotifyEperm && r.when.kind == SeccompArgCheck::Kind::kAlways) {
      outright.insert(r.syscall);
    }
  }
  EXPECT_EQ(outright, std::set<std::string>(kAlwaysDenied.begin(), kAlwaysDenied.end()));
  std::set<std::string> grantable;
  for (const auto& name : outright) {
    EXPECT_TRUE(SyscallDeniedOutright(name)) << name;
    if (!SyscallGrantProblem(name)) grantable.insert(name);
  }
  EXPECT_EQ(grantable, (std::set<std::string>{"ptrace", "process_vm_readv", "process_vm_writev"}));
  for (const auto& r : plan.rules) {
    if (outright.count(r.syscall) == 0) { EXPECT_FALSE(SyscallDeniedOutright(r.syscall)) << r.syscall; }
  }
}

class RandomPolicies {
 public:
  explicit RandomPolicies(unsigned seed) : rng_(seed) {}

  std::string Path() {
    static const char* kRoots[] = {"/usr", "/etc", "/opt", "/home/u", "/home/u/proj", "/srv", "/var/lib", "~"};
    static const char* kParts[] = {"a", ".ssh", ".env", "**", "*.key", "x y", "..", ".git", "hooks", "[ab]"};
    std::string p = kRoots[Pick(std::size(kRoots))];
    for (size_t i = Pick(4); i > 0; --i) p += std::string("/") + kParts[Pick(std::size(kParts))];
    return p;
  }
  std::string Rel() {
    static const char* kRel[] = {".git/hooks", ".git/config", "src", "a/b/c", ".env", "**/.env", "Makefile"};
    return kRel[Pick(std::size(kRel))];
  }
  std::string Name() {
    std::string s;
    for (size_t i = 1 + Pick(8); i > 0; --i) s += static_cast<char>('A' + Pick(26));
    return s;
  }

  Policy Next() {
    static const Mode kModes[] = {Mode::kReadOnly, Mode::kWorkspaceWrite};
    Policy p = PresetFor(kModes[Pick(2)]);
    p.sandbox.require = Requirement::kPartial;
    if (Pick(2)) p.filesystem.read_only.clear();
    for (size_t i = Pick(5); i > 0; --i) p.filesystem.read_only.push_back(Path());
    if (Pick(2)) p.filesystem.deny.clear();
    for (size_t i = Pick(5); i > 0; --i) p.filesystem.deny.push_back(Pick(2) ? Path() : Rel());
    if (Pick(2)) p.filesystem.protect.clear();
    for (size_t i = Pick(3); i > 0; --i) p.filesystem.protect.push_back(Rel());
    if (Pick(3) == 0) p.filesystem.workspace.path = "/workspace";
    if (Pick(2)) p.filesystem.workspace.access = Pick(2) ? Access::kReadOnly : Access::kReadWrite;
    for (size_t i = Pick(4); i > 0; --i) p.env.pass.push_back(Name());
    for (size_t i = Pick(4); i > 0; --i) p.env.set.emplace_back(Name(), Path());
    if (Pick(3) == 0) p.network.allow.push_back("example.com");
    if (Pick(3) == 0) p.resources.max_processes = 1 + Pick(1000);
    if (Pick(3) == 0) p.resources.disk_bytes = (1 + Pick(8)) << 30;
    if (Pick(3) == 0) p.resources.wall_clock_ms = 1 + Pick(100000);
    return p;
  }

 private:
  size_t Pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  std::mt19937 rng_;
};

void ExpectDenies(const Plan& plan, const std::string& context) {
  ASSERT_TRUE(plan.seccomp.enabled) << context;
  EXPECT_TRUE(plan.seccomp.refuse_foreign_arches) << context;
  std::set<std::string> always;
  bool clone_checked = false, clone3_enosys = false;
  for (const auto& r : plan.seccomp.rules) {
    if (r.when.kind == SeccompArgCheck::Kind::kAlways && r.action == SeccompAction::kNotifyEperm) {
      always.insert(r.syscall);
    }
    if (r.syscall == "clone" && r.when.kind == SeccompArgCheck::Kind::kAnyBitSet && r.when.arg == 0 &&
        !r.when.has_except && (r.when.mask & kCloneNamespaceFlags) == kCloneNamespaceFlags) {
      clone_checked = true;
    }
    if (r.syscall == "clone3" && r.when.kind == SeccompArgCheck::Kind::kAlways &&
        r.action == SeccompAction::kErrnoEnosys) {
      clone3_enosys = true;
    }
  }
  for (const auto& name : kAlwaysDenied) EXPECT_TRUE(always.count(name)) << name << " not denied; " << context;
  EXPECT_TRUE(clone_checked) << "clone with namespace flags not denied; " << context;
  EXPECT_TRUE(clone3_enosys) << "clone3 not answered ENOSYS; " << context;
}

bool MediatesListenAndRefusesUdp(const SeccompPlan& sp) {
  bool listen = false, udp4 = false, udp6 = false;
  for (const auto& r : sp.rules) {
    listen |= r.syscall == "listen" && r.action == SeccompAction::kNotifyMediate;
    const bool dgram = r.syscall == "socket" && r.action == SeccompAction::kNotifyEperm &&
                       r.when.kind == SeccompArgCheck::Kind::kLow32Equals && r.when.arg == 0 && r.when.has_also &&
                       r.when.also_arg == 1 && r.when.also_value == 2 /*SOCK_DGRAM*/;
    udp4 |= dgram && r.when.value == 2 /*AF_INET*/;
    udp6 |= dgram && r.when.value == 10 /*AF_INET6*/;
  }
  return listen && udp4 && udp6;
}

// The rule of `sp` that refuses this call, read as CompileSeccomp
// (src/linux/seccomp_filter.cc) compiles each kind, or null.
const SeccompRule* Refusing(const SeccompPlan& sp, const std::string& syscall, std::array<std::uint64_t, 6> args) {
  constexpr std::uint64_t kLow32 = 0xffffffff;
  for (const auto& r : sp.rules) {
    if (r.syscall != syscall || r.action != SeccompAction::kNotifyEperm) continue;
    const SeccompArgCheck& w = r.when;
    const std::uint64_t a = args[w.arg];
    bool match = false;
    switch (w.kind) {
      case SeccompArgCheck::Kind::kAlways: match = true; break;
      case SeccompArgCheck::Kind::kAnyBitSet:
        match = (a & w.mask) != 0 && !(w.has_except && (a & kLow32) == (w.except & kLow32));
        break;
      case SeccompArgCheck::Kind::kLow32Equals: match = (a & kLow32) == (w.value & kLow32); break;
      case SeccompArgCheck::Kind::kMaskedEquals: match = (a & w.mask) == w.value; break;
      case SeccompArgCheck::Kind::kLow32NotIn:
        match = a >= w.value || std::find(w.values.begin(), w.values.end(), a & kLow32) == w.values.end();
        break;
    }
    if (match && w.has_also) match = (args[w.also_arg] & w.also_mask) == w.also_value;
    if (match) return &r;
  }
  return nullptr;
}

// socket(2) as Node's os.networkInterfaces (getifaddrs) makes it, and its kin.
TEST(SeccompPlan, NetlinkRouteAloneOfTheNetlinkProtocols) {
  constexpr std::uint64_t kAfNetlink = 16, kSockRaw = 3, kSockDgram = 2, kCloexec = 02000000, kNonblock = 04000;
  for (SocketScope scope : {SocketScope::kOwnNamespace, SocketScope::kHostNetwork}) {
    const SeccompPlan sp = PlanSeccomp(true, scope);
    const std::string where = scope == SocketScope::kHostNetwork ? "host network" : "own network";
    auto refusing = [&](std::uint64_t domain, std::uint64_t type, std::uint64_t protocol) {
      return Refusing(sp, "socket", {domain, type, protocol, 0, 0, 0});
    };
    EXPECT_EQ(refusing(kAfNetlink, kSockRaw | kCloexec, 0), nullptr) << where;
    EXPECT_EQ(refusing(kAfNetlink, kSockRaw, 0), nullptr) << where;
    EXPECT_EQ(refusing(kAfNetlink, kSockDgram | kCloexec | kNonblock, 0), nullptr) << where;
    // NETLINK_SOCK_DIAG, NETLINK_AUDIT, NETLINK_NETFILTER, NETLINK_KOBJECT_UEVENT, NETLINK_GENERIC.
    for (std::uint64_t protocol : {4, 9, 12, 15, 16}) {
      for (std::uint64_t type : {kSockRaw, kSockDgram | kCloexec}) {
        const SeccompRule* r = refusing(kAfNetlink, type, protocol);
        ASSERT_NE(r, nullptr) << where << ": netlink protocol " << protocol << " type " << type;
        EXPECT_NE(r->why.find("NETLINK_ROUTE"), std::string::npos) << r->why;
      }
    }
    // The kernel reads an int; high bits are refused rather than ignored.
    EXPECT_NE(refusing(kAfNetlink, kSockRaw, 1ULL << 32), nullptr) << where;
    // Raw and packet sockets of every other family stay refused.
    EXPECT_NE(refusing(2 /*AF_INET*/, kSockRaw, 1 /*ICMP*/), nullptr) << where;
    EXPECT_NE(refusing(10 /*AF_INET6*/, kSockRaw | kCloexec, 58 /*ICMPV6*/), nullptr) << where;
    EXPECT_NE(refusing(1 /*AF_UNIX*/, kSockRaw, 0), nullptr) << where;
    EXPECT_NE(refusing(17 /*AF_PACKET*/, kSockRaw, 0x0300), nullptr) << where;
    EXPECT_NE(refusing(2 /*AF_INET*/, 10 /*SOCK_PACKET*/, 0x0300), nullptr) << where;
    EXPECT_NE(refusing(kAfNetlink, 10 /*SOCK_PACKET*/, 0), nullptr) << where;
    EXPECT_NE(refusing(40 /*AF_VSOCK*/, 1, 0), nullptr) << where;
    EXPECT_NE(refusing(kAfNetlink | (1ULL << 32), kSockRaw, 0), nullptr) << where;
    // What tools use every day passes.
    EXPECT_EQ(refusing(2 /*AF_INET*/, 1 /*SOCK_STREAM*/ | kCloexec, 0), nullptr) << where;
    EXPECT_EQ(refusing(10 /*AF_INET6*/, 1 /*SOCK_STREAM*/, 6), nullptr) << where;
    EXPECT_EQ(refusing(1 /*AF_UNIX*/, 1 /*SOCK_STREAM*/ | kCloexec, 0), nullptr) << where;
  }
}

TEST(SeccompPlan, HostNetworkRulesOnlyWithoutANetworkNamespace) {
  EXPECT_FALSE(MediatesListenAndRefusesUdp(PlanSeccomp(true)));
  EXPECT_TRUE(MediatesListenAndRefusesUdp(PlanSeccomp(true, SocketScope::kHostNetwork)));
  EXPECT_FALSE(PlanSeccomp(false, SocketScope::kHostNetwork).enabled);
}

TEST(SeccompPlanProperty, RandomPoliciesAlwaysDenyTheListOnBothBackends) {
  RandomPolicies gen(20240611);
  Invocation inv = testing::FakeInvocation("/home/u/proj");
  int planned[2] = {0, 0};
  for (int i = 0; i < 3000; ++i) {
    Policy policy = gen.Next();
    for (int b = 0; b < 2; ++b) {
      const bool landlock = b == 1;
      inv.backend = landlock ? BackendChoice::kLandlock : BackendChoice::kAuto;
      // The landlock-only backend also by automatic choice on a host without user namespaces.
      HostCaps host = testing::FakeHost(!(landlock && i % 2 == 0));
      auto c = Confine({"sh", "-c", "true"}, policy, host, inv);
      if (!c.ok()) continue;  // a policy the planner refuses (deny containing a mounted tree)
      ++planned[b];
      const std::string context = "iteration " + std::to_string(i) + (landlock ? " landlock" : " namespaces");
      ExpectDenies(c->plan, context);
      // The plan itself never asks for a namespace on the landlock-only backend.
      EXPECT_EQ(c->plan.backend, landlock ? Backend::kLandlockOnly : Backend::kNamespaces) << context;
      if (landlock) {
        EXPECT_TRUE(c->plan.namespaces.empty()) << context;
      }
      // The host's network (landlock-only): listen() mediated, UDP refused.
      EXPECT_EQ(MediatesListenAndRefusesUdp(c->plan.seccomp), landlock) << context;
      // It survives the trip through `wrap`.
      auto back = PlanFromJson(PlanToJson(c->plan));
      ASSERT_TRUE(back.ok()) << back.status().message();
      ExpectDenies(*back, context + " after JSON");
      if (HasFailure()) return;
    }
  }
  EXPECT_GT(planned[0], 2000);
  EXPECT_GT(planned[1], 2000);
}

}  // namespace
}  // namespace agentbox
