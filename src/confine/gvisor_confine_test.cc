// sandbox.isolation: container planned against fake hosts: no runsc involved.
#include <gtest/gtest.h>

#include <algorithm>

#include "agentbox/confine.h"
#include "agentbox/plan.h"
#include "confine/fake_host.h"

namespace agentbox {
namespace {

using testing::FacetNamed;
using testing::HasMechanism;

// A host with every facility and gVisor's runsc found by the ladder probe.
HostCaps GvisorHost(bool rootless = true) {
  HostCaps h = testing::FakeHost();
  h.ladder.probed = true;
  h.ladder.runsc = "/usr/bin/runsc";
  h.ladder.runsc_version = "0.0~20221219.0";
  h.ladder.runsc_rootless = rootless;
  return h;
}

Policy ContainerPolicy() {
  Policy p = PresetFor(Mode::kWorkspaceWrite);
  p.sandbox.isolation = Isolation::kContainer;
  return p;
}

// Refused at stage confine, saying it will not downgrade, with `why` in the message.
void ExpectRefused(const Result<ConfinedCommand>& c, const std::string& why) {
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().stage(), "confine");
  EXPECT_NE(c.status().message().find("refusing rather than downgrading"), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find(why), std::string::npos) << c.status().message();
}

// The plan is the gVisor backend's, with runsc as probed and no host-kernel
// layers gVisor does not have (Landlock, the connect() broker).
TEST(GvisorConfine, ContainerPlansTheGvisorBackend) {
  for (bool rootless : {true, false}) {
    auto c = Confine({"make"}, ContainerPolicy(), GvisorHost(rootless), testing::FakeInvocation());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    const Plan& p = c->plan;
    EXPECT_EQ(p.backend, Backend::kGvisor);
    ASSERT_TRUE(p.gvisor.has_value());
    EXPECT_EQ(p.gvisor->runsc, "/usr/bin/runsc");
    EXPECT_EQ(p.gvisor->version, "0.0~20221219.0");
    EXPECT_EQ(p.gvisor->rootless, rootless);
    EXPECT_FALSE(p.network.broker);
    EXPECT_EQ(p.landlock.abi, 0);  // the fake host has Landlock ABI 7: dropped on purpose
    EXPECT_EQ(c->enforcement.backend, "gvisor");
    EXPECT_EQ(c->enforcement.level, Level::kFull);
  }
}

// The report names runsc as the kernel the command talks to, and gVisor's
// mechanisms for the facets the Sentry enforces.
TEST(GvisorConfine, ReportNamesRunscAndGvisorMechanisms) {
  EnforcementReport r = AssessEnforcement(ContainerPolicy(), GvisorHost(), testing::FakeInvocation());
  EXPECT_EQ(r.backend, "gvisor");
  EXPECT_EQ(r.runtime.rfind("runsc 0.0~20221219.0 (platform ptrace", 0), 0u) << r.runtime;
  EXPECT_NE(r.runtime.find("rootless"), std::string::npos) << r.runtime;
  for (const char* name : {"filesystem", "network", "processes", "syscalls"}) {
    const FacetReport* f = FacetNamed(r, name);
    ASSERT_NE(f, nullptr) << name;
    EXPECT_EQ(f->level, Level::kFull) << name;
    EXPECT_TRUE(std::any_of(f->mechanisms.begin(), f->mechanisms.end(),
                            [](const std::string& m) { return m.rfind("gvisor-", 0) == 0; }))
        << name;
  }
  EXPECT_TRUE(HasMechanism(FacetNamed(r, "filesystem"), "gvisor-sentry"));
  EXPECT_TRUE(HasMechanism(FacetNamed(r, "network"), "gvisor-network-none"));
  EXPECT_FALSE(HasMechanism(FacetNamed(r, "filesystem"), "landlock"));
}

// max_processes is the Sentry's RLIMIT_NPROC, never a host pids cgroup
// (which would count the Sentry's own threads), even where one is delegated.
TEST(GvisorConfine, MaxProcessesIsNprocNotAPidsCgroup) {
  Policy pol = ContainerPolicy();
  pol.resources.max_processes = 64;
  HostCaps host = GvisorHost();
  host.kernel_release = "6.1.0";
  host.cgroups.probed = true;
  host.cgroups.can_create_children = true;
  host.cgroups.delegated = {{"pids", "v1"}};
  auto c = Confine({"true"}, pol, host, testing::FakeInvocation());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->plan.limits.pids_max.has_value());
  EXPECT_EQ(c->plan.limits.nproc, std::optional<std::uint64_t>(64));
  const FacetReport* res = FacetNamed(c->enforcement, "resources");
  ASSERT_NE(res, nullptr);
  EXPECT_TRUE(res->requested);
  EXPECT_TRUE(HasMechanism(res, "gvisor-rlimit-nproc"));
  EXPECT_FALSE(HasMechanism(res, "cgroup-v1-pids"));
}

// No ladder probe, or no runsc: refused, never run on the host kernel
// instead, whatever `require` says.
TEST(GvisorConfine, WithoutRunscIsRefusedUnderFullAndPartial) {
  for (Requirement req : {Requirement::kFull, Requirement::kPartial}) {
    Policy pol = ContainerPolicy();
    pol.sandbox.require = req;
    ExpectRefused(Confine({"true"}, pol, testing::FakeHost(), testing::FakeInvocation()), "not looked for");
    HostCaps host = testing::FakeHost();
    host.ladder.probed = true;
    host.ladder.runsc_why = "gVisor's runsc is not installed (Debian package runsc)";
    ExpectRefused(Confine({"true"}, pol, host, testing::FakeInvocation()),
                  "gVisor's runsc is not installed (Debian package runsc)");
    // The report for check/explain says the same, and is not full.
    EnforcementReport r = AssessEnforcement(pol, host, testing::FakeInvocation());
    EXPECT_NE(r.level, Level::kFull);
  }
}

// Egress as root: the proxy's ports in the plan, the variables naming
// them, host sockets in a namespace of the run's said in the report.
TEST(GvisorConfine, EgressAsRootPlansTheProxyInAPreparedNamespace) {
  Policy net = ContainerPolicy();
  net.network.allow = {"pypi.org"};
  auto c = Confine({"true"}, net, GvisorHost(false), testing::FakeInvocation());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->plan.network.proxy.has_value());
  EXPECT_FALSE(c->plan.network.broker);
  EXPECT_TRUE(c->plan.network.dns_address.empty());
  bool proxy_var = false;
  for (const auto& [k, v] : c->plan.env.set) proxy_var |= k == "HTTP_PROXY" && v.find("3128") != std::string::npos;
  EXPECT_TRUE(proxy_var);
  const FacetReport* f = FacetNamed(c->enforcement, "network");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(HasMechanism(f, "gvisor-hostinet-private-netns"));
  EXPECT_TRUE(HasMechanism(f, "egress-proxy"));
  EXPECT_FALSE(HasMechanism(f, "gvisor-network-none"));

  // TLS termination needs the run's CA inside: refused, root or not.
  Policy rules = net;
  rules.network.http_rules.push_back(HttpRuleSpec{});
  rules.network.http_rules.back().host = "pypi.org";
  ExpectRefused(Confine({"true"}, rules, GvisorHost(false), testing::FakeInvocation()), "http_rules");
}

// What gVisor cannot give in this version is refused, not dropped: a run's
// egress without root, TLS ended in the proxy, a host unix socket. A
// session's sandbox has no network device (its egress rides its stream),
// so it gets egress without root.
TEST(GvisorConfine, RunEgressWithoutRootAndUnixSocketsAreRefusedSessionsAreNot) {
  Invocation session = testing::FakeInvocation();
  session.session = true;
  auto world = Confine({"true"}, ContainerPolicy(), GvisorHost(), session);
  ASSERT_TRUE(world.ok()) << world.status().ToString();
  EXPECT_EQ(world->plan.backend, Backend::kGvisor);

  Policy net = ContainerPolicy();
  net.network.allow = {"pypi.org"};
  ExpectRefused(Confine({"true"}, net, GvisorHost(), testing::FakeInvocation()), "runsc --rootless cannot join");
  auto egress_world = Confine({"true"}, net, GvisorHost(), session);
  ASSERT_TRUE(egress_world.ok()) << egress_world.status().ToString();
  EXPECT_TRUE(egress_world->plan.network.proxy.has_value());
  Policy rules = net;
  rules.network.http_rules.push_back(HttpRuleSpec{});
  rules.network.http_rules.back().host = "pypi.org";
  ExpectRefused(Confine({"true"}, rules, GvisorHost(), session), "http_rules");

  Policy sock = ContainerPolicy();
  sock.filesystem.unix_sockets = {"/run/user/1000/bus"};
  ExpectRefused(Confine({"true"}, sock, GvisorHost(), testing::FakeInvocation()), "filesystem.unix_sockets");
}

// --backend picks between host-kernel backends: with container it is refused.
TEST(GvisorConfine, ForcedBackendIsRefused) {
  Invocation inv = testing::FakeInvocation();
  inv.backend = BackendChoice::kNamespaces;
  auto c = Confine({"true"}, ContainerPolicy(), GvisorHost(), inv);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().stage(), "confine");
  EXPECT_NE(c.status().message().find("--backend"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("gVisor"), std::string::npos) << c.status().message();
}

// remote is still unavailable; microvm on a host with runsc but no QEMU is
// refused naming what is missing, never run on gVisor instead.
// A command confined here is never sent elsewhere: remote is a session's
// world (session/remote_world.h), refused for `run` and `wrap` naming why.
TEST(GvisorConfine, RemoteIsRefusedForACommandRunHereAndMicrovmNeedsQemu) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.sandbox.isolation = Isolation::kRemote;
  Status s = CheckAvailable(pol);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("runs a session's world on another host"), std::string::npos) << s.message();
  EXPECT_TRUE(CheckAvailable(ContainerPolicy()).ok());
  Policy vm = PresetFor(Mode::kWorkspaceWrite);
  vm.sandbox.isolation = Isolation::kMicrovm;
  EXPECT_TRUE(CheckAvailable(vm).ok());
  ExpectRefused(Confine({"true"}, vm, GvisorHost(), testing::FakeInvocation()), "QEMU is not installed");
  ExpectRefused(Confine({"true"}, pol, GvisorHost(), testing::FakeInvocation()), "refusing rather than downgrading");
}

}  // namespace
}  // namespace agentbox
