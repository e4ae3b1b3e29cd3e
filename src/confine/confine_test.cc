// Planning against fake hosts: no kernel involved.
#include "agentbox/confine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <regex>

#include "agentbox/plan.h"
#include "confine/fake_host.h"
#include "linux/compat.h"

namespace agentbox {
namespace {

using testing::FacetNamed;
using testing::HasMechanism;

HostCaps FullHost() { return testing::FakeHost(); }

HostCaps NoUserns() { return testing::FakeHost(/*userns=*/false); }

Invocation Inv() { return testing::FakeInvocation(); }

const MountOp* Find(const Plan& p, MountKind kind, const std::string& target) {
  for (const auto& m : p.mounts) {
    if (m.kind == kind && m.target == target) return &m;
  }
  return nullptr;
}

size_t IndexOf(const Plan& p, const std::string& target) {
  for (size_t i = 0; i < p.mounts.size(); ++i) {
    if (p.mounts[i].target == target) return i;
  }
  return SIZE_MAX;
}

TEST(Confine, WorkspaceWriteOnFullHostIsFull) {
  auto c = Confine({"make", "test"}, PresetFor(Mode::kWorkspaceWrite), FullHost(), Inv());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->enforcement.level, Level::kFull);
  EXPECT_EQ(c->enforcement.backend, "linux-namespaces");
  EXPECT_TRUE(c->enforcement.missing.empty());
  const Plan& p = c->plan;
  EXPECT_TRUE(p.confined);
  EXPECT_EQ(p.argv, (std::vector<std::string>{"make", "test"}));
  EXPECT_EQ(p.cwd, "/home/u/proj/src");
  for (const char* ns : {"user", "mnt", "pid", "net", "ipc", "uts", "cgroup"}) {
    EXPECT_NE(std::find(p.namespaces.begin(), p.namespaces.end(), ns), p.namespaces.end()) << ns;
  }
}

// A container's seccomp profile refusing sethostname: the uts namespace
// stays, the plan names no hostname, and the report says why.
TEST(Confine, RefusedSethostnameLeavesTheNameAndSaysSo) {
  HostCaps h = FullHost();
  EXPECT_EQ(Confine({"true"}, PresetFor(Mode::kWorkspaceWrite), h, Inv())->plan.hostname, "agentbox");
  h.seccomp_mode = 2;
  h.sethostname_errno = EPERM;
  auto c = Confine({"true"}, PresetFor(Mode::kWorkspaceWrite), h, Inv());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->plan.hostname, "");
  EXPECT_NE(std::find(c->plan.namespaces.begin(), c->plan.namespaces.end(), "uts"), c->plan.namespaces.end());
  const FacetReport* proc = FacetNamed(c->enforcement, "processes");
  ASSERT_NE(proc, nullptr);
  EXPECT_EQ(proc->level, Level::kFull);
  ASSERT_FALSE(proc->notes.empty());
  EXPECT_NE(proc->notes.back().find("hostname stays the container's"), std::string::npos) << proc->notes.back();
}

TEST(Confine, RootIsTmpfsFirstAndSystemDirsReadOnly) {
  auto c = Confine({"true"}, PresetFor(Mode::kWorkspaceWrite), FullHost(), Inv());
  ASSERT_TRUE(c.ok());
  const Plan& p = c->plan;
  ASSERT_FALSE(p.mounts.empty());
  EXPECT_EQ(p.mounts[0].kind, MountKind::kTmpfs);
  EXPECT_EQ(p.mounts[0].target, "/");
  for (const char* dir : {"/usr", "/etc", "/bin", "/lib"}) {
    const MountOp* m = Find(p, MountKind::kBind, dir);
    ASSERT_NE(m, nullptr) << dir;
    EXPECT_TRUE(m->read_only) << dir;
    EXPECT_TRUE(m->optional) << dir;
  }
}

TEST(Confine, WorkspaceIsWritableAndHomeIsPrivate) {
  auto c = Confine({"true"}, PresetFor(Mode::kWorkspaceWrite), FullHost(), Inv());
  ASSERT_TRUE(c.ok());
  const Plan& p = c->plan;
  const MountOp* ws = Find(p, MountKind::kBind, "/home/u/proj");
  ASSERT_NE(ws, nullptr);
  EXPECT_FALSE(ws->read_only);
  EXPECT_FALSE(ws->optional);  // a missing workspace is a sandbox error, not a skip
  EXPECT_NE(Find(p, MountKind::kTmpfs, "/home/u"), nullptr);
  EXPECT_NE(Find(p, MountKind::kTmpfs, "/tmp"), nullptr);
  // The private home is mounted before the workspace inside it.
  EXPECT_LT(IndexOf(p, "/home/u"), IndexOf(p, "/home/u/proj"));
  EXPECT_EQ(p.home, "/home/u");
}

TEST(Confine, ReadOnlyModeMakesWorkspaceReadOnlyAndSkipsProtect) {
  auto c = Confine({"true"}, PresetFor(Mode::kReadOnly), FullHost(), Inv());
  ASSERT_TRUE(c.ok());
  const MountOp* ws = Find(c->plan, MountKind::kBind, "/home/u/proj");
  ASSERT_NE(ws, nullptr);
  EXPECT_TRUE(ws->read_only);
  EXPECT_EQ(Find(c->plan, MountKind::kProtect, "/home/u/proj/.git/hooks"), nullptr);
}

TEST(Confine, WorkspaceAtAnotherInsidePath) {
  Policy p = PresetFor(Mode::kWorkspaceWrite);
  p.filesystem.workspace.path = "/workspace";
  Invocation inv = Inv();
  auto c = Confine({"true"}, p, FullHost(), inv);
  ASSERT_TRUE(c.ok());
  const MountOp* ws = Find(c->plan, MountKind::kBind, "/workspace");
  ASSERT_NE(ws, nullptr);
  EXPECT_EQ(ws->source, "/home/u/proj");
  EXPECT_EQ(c->plan.cwd, "/workspace/src");
  EXPECT_NE(Find(c->plan, MountKind::kProtect, "/workspace/.git/hooks"), nullptr);
}

TEST(Confine, ProtectPinsEveryAncestorBeforeTheProtectedPath) {
  auto c = Confine({"true"}, PresetFor(Mode::kWorkspaceWrite), FullHost(), Inv());
  ASSERT_TRUE(c.ok());
  const Plan& p = c->plan;
  const MountOp* hooks = Find(p, MountKind::kProtect, "/home/u/proj/.git/hooks");
  const MountOp* config = Find(p, MountKind::kProtect, "/home/u/proj/.git/config");
  const MountOp* pin = Find(p, MountKind::kPin, "/home/u/proj/.git");
  ASSERT_NE(hooks, nullptr);
  ASSERT_NE(config, nullptr);
  ASSERT_NE(pin, nullptr);
  EXPECT_TRUE(hooks->read_only);
  EXPECT_LT(IndexOf(p, "/home/u/proj"), IndexOf(p, "/home/u/proj/.git"));
  EXPECT_LT(IndexOf(p, "/home/u/proj/.git"), IndexOf(p, "/home/u/proj/.git/hooks"));
  // One pin for the shared ancestor, not one per protected path.
  EXPECT_EQ(std::count_if(p.mounts.begin(), p.mounts.end(),
                          [](const MountOp& m) { return m.kind == MountKind::kPin; }),
            1);
}

// `.git/NAME` entries name what every repository of the workspace gets
// protected; other entries stay where they are.
TEST(Confine, GitEntriesOfProtectCoverEveryRepository) {
  Invocation inv = Inv();
  inv.cache_dir = "/home/u/.cache/agentbox";
  auto c = Confine({"true"}, PresetFor(Mode::kWorkspaceWrite), FullHost(), inv);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->plan.protect_git, (std::vector<std::string>{"hooks", "config"}));
  EXPECT_FALSE(c->plan.scan_cache_dir.empty()) << "finding repositories shares the deny scan's cache";
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.filesystem.protect = {".git/hooks", "docs/keep", ".git/a/b"};
  auto d = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->plan.protect_git, (std::vector<std::string>{"hooks"}));
  pol.filesystem.protect = {};
  auto e = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->plan.protect_git.empty());
  auto ro = Confine({"true"}, PresetFor(Mode::kReadOnly), FullHost(), Inv());
  ASSERT_TRUE(ro.ok());
  EXPECT_TRUE(ro->plan.protect_git.empty()) << "a read-only workspace needs no protection";
}

TEST(Confine, DenyInsideMountedTreeIsMaskedAndOutsideIsAbsent) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.filesystem.deny = {"~/.ssh", "/etc/shadow", "secrets/key.pem", "/opt/vault"};
  auto c = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_TRUE(c.ok());
  const Plan& p = c->plan;
  EXPECT_NE(Find(p, MountKind::kMask, "/etc/shadow"), nullptr);                 // inside /etc
  EXPECT_NE(Find(p, MountKind::kMask, "/home/u/proj/secrets/key.pem"), nullptr); // workspace-relative
  // ~/.ssh is not under any mounted tree (HOME is a private tmpfs): absent.
  EXPECT_NE(std::find(p.absent.begin(), p.absent.end(), "/home/u/.ssh"), p.absent.end());
  EXPECT_NE(std::find(p.absent.begin(), p.absent.end(), "/opt/vault"), p.absent.end());
}

TEST(Confine, DenyUnderAWorkspaceThatHoldsHomeIsMasked) {
  Invocation inv = Inv();
  inv.workspace = "/home/u";
  inv.cwd = "/home/u";
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  auto c = Confine({"true"}, pol, FullHost(), inv);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(Find(c->plan, MountKind::kMask, "/home/u/.ssh"), nullptr);
  // No private tmpfs over the workspace itself.
  EXPECT_EQ(Find(c->plan, MountKind::kTmpfs, "/home/u"), nullptr);
}

TEST(Confine, DenyContainingTheWorkspaceIsRefused) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.filesystem.deny = {"~"};
  auto c = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("contains '/home/u/proj'"), std::string::npos) << c.status().message();
}

TEST(Confine, DenyGlobBecomesAScanOfTheWorkspace) {
  auto c = Confine({"true"}, PresetFor(Mode::kWorkspaceWrite), FullHost(), Inv());
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->plan.deny_globs.size(), 1u);
  const GlobScan& g = c->plan.deny_globs[0];
  EXPECT_EQ(g.source_root, "/home/u/proj");
  EXPECT_EQ(g.target_root, "/home/u/proj");
  EXPECT_EQ(g.patterns, std::vector<std::string>{"**/.env"});
}

TEST(Confine, HomeGlobAboveTheWorkspaceScansTheWorkspaceWithABase) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.filesystem.deny = {"~/**/id_*"};
  auto c = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->plan.deny_globs.size(), 1u);
  EXPECT_EQ(c->plan.deny_globs[0].source_root, "/home/u/proj");
  EXPECT_EQ(c->plan.deny_globs[0].pattern_base, "proj");
}

TEST(Confine, ProcIsMaskedAndSysReadOnly) {
  auto c = Confine({"true"}, PresetFor(Mode::kWorkspaceWrite), FullHost(), Inv());
  ASSERT_TRUE(c.ok());
  for (const char* f : {"/proc/kcore", "/proc/keys", "/proc/sysrq-trigger", "/proc/timer_list"}) {
    EXPECT_NE(Find(c->plan, MountKind::kMask, f), nullptr) << f;
  }
  EXPECT_NE(Find(c->plan, MountKind::kReadOnly, "/proc/sys"), nullptr);
  EXPECT_LT(IndexOf(c->plan, "/proc"), IndexOf(c->plan, "/proc/sys"));
}

TEST(Confine, EnvironmentIsScrubbedToPassAndSet) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.env.pass = {"PATH", "LANG"};
  pol.env.set = {{"CI", "1"}};
  auto c = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_TRUE(c.ok());
  const EnvRules& e = c->plan.env;
  EXPECT_FALSE(e.pass_all);
  EXPECT_EQ(e.pass, (std::vector<std::string>{"PATH", "LANG"}));
  auto has = [&](const std::string& k, const std::string& v) {
    return std::find(e.set.begin(), e.set.end(), std::make_pair(k, v)) != e.set.end();
  };
  EXPECT_TRUE(has("CI", "1"));
  EXPECT_TRUE(has("HOME", "/home/u"));
  EXPECT_TRUE(has("TMPDIR", "/tmp"));
}

TEST(Confine, NoUserNamespacesFailsClosed) {
  auto c = Confine({"true"}, PresetFor(Mode::kWorkspaceWrite), NoUserns(), Inv());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().stage(), "confine");
  EXPECT_NE(c.status().message().find("unprivileged_userns_clone"), std::string::npos) << c.status().message();
}

TEST(Confine, MissingFacetsListedInTheAssessment) {
  EnforcementReport r = AssessEnforcement(PresetFor(Mode::kWorkspaceWrite), NoUserns());
  EXPECT_EQ(r.level, Level::kPartial);
  std::vector<std::string> facets;
  for (const auto& m : r.missing) facets.push_back(m.facet);
  for (const char* f : {"filesystem", "processes"}) {
    EXPECT_NE(std::find(facets.begin(), facets.end(), f), facets.end()) << f;
  }
  // The landlock-only backend fences the network in full on Landlock ABI >= 4.
  EXPECT_EQ(std::find(facets.begin(), facets.end(), "network"), facets.end());
}

TEST(Confine, UnimplementedResourcesFailClosedUnlessPartialIsAccepted) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.resources.memory_limit_bytes = 1ull << 30;
  auto strict = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.status().message().find("memory_gib"), std::string::npos);
  pol.sandbox.require = Requirement::kPartial;
  auto relaxed = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_TRUE(relaxed.ok());
  EXPECT_EQ(relaxed->enforcement.level, Level::kPartial);
  ASSERT_EQ(relaxed->enforcement.missing.size(), 1u);
  EXPECT_EQ(relaxed->enforcement.missing[0].facet, "resources");
}

std::string MissingText(const EnforcementReport& r) {
  std::string all;
  for (const auto& m : r.missing) all += m.facet + ": " + m.reason + "\n";
  return all;
}

TEST(Confine, MaxProcessesWithoutPidsCgroupIsNprocInTheSandboxsUserNamespace) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.resources.max_processes = 64;
  HostCaps host = FullHost();
  host.kernel_release = "6.1.0-18-amd64";
  auto c = Confine({"true"}, pol, host, Inv());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->enforcement.level, Level::kFull) << MissingText(c->enforcement);
  const FacetReport* res = FacetNamed(c->enforcement, "resources");
  EXPECT_TRUE(HasMechanism(res, "rlimit-nproc-userns"));
  EXPECT_EQ(c->plan.limits.nproc, std::optional<std::uint64_t>(64));
  EXPECT_FALSE(c->plan.limits.pids_max.has_value());
  EXPECT_FALSE(c->plan.limits.NeedsCgroup());
}

TEST(Confine, APidsCgroupIsPreferredToNproc) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.resources.max_processes = 64;
  HostCaps host = FullHost();
  host.kernel_release = "6.1.0";
  host.cgroups.probed = true;
  host.cgroups.can_create_children = true;
  host.cgroups.delegated = {{"pids", "v1"}};
  auto c = Confine({"true"}, pol, host, Inv());
  ASSERT_TRUE(c.ok()) << c.status().message();
  const FacetReport* res = FacetNamed(c->enforcement, "resources");
  EXPECT_TRUE(HasMechanism(res, "cgroup-v1-pids"));
  EXPECT_FALSE(HasMechanism(res, "rlimit-nproc-userns"));
  EXPECT_EQ(c->plan.limits.pids_max, std::optional<std::uint64_t>(64));
  EXPECT_FALSE(c->plan.limits.nproc.has_value());
}

TEST(Confine, NprocIsNotOfferedWhereItWouldNotCapTheSandbox) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.resources.max_processes = 64;
  struct Case {
    const char* name;
    HostCaps host;
    const char* reason;
  };
  HostCaps root = FullHost();
  root.uid = 0;
  root.kernel_release = "6.1.0";
  HostCaps old_kernel = FullHost();
  old_kernel.kernel_release = "5.10.0-28-amd64";
  HostCaps no_userns = NoUserns();
  no_userns.kernel_release = "6.1.0";
  for (const Case& k : {Case{"root", root, "does not bind uid 0"},
                        Case{"5.10", old_kernel, "counts RLIMIT_NPROC per user, not per user namespace"},
                        Case{"landlock-only", no_userns, "no user namespace of its own"}}) {
    SCOPED_TRACE(k.name);
    EnforcementReport r = AssessEnforcement(pol, k.host, Inv());
    const std::string missing = MissingText(r);
    EXPECT_NE(missing.find("resources: max_processes: not enforced"), std::string::npos) << missing;
    const FacetReport* res = FacetNamed(r, "resources");
    ASSERT_NE(res, nullptr);
    EXPECT_FALSE(HasMechanism(res, "rlimit-nproc-userns"));
    std::string notes;
    for (const auto& n : res->notes) notes += n + "\n";
    EXPECT_NE(notes.find(k.reason), std::string::npos) << notes;
    pol.sandbox.require = Requirement::kPartial;
    auto c = Confine({"true"}, pol, k.host, Inv());
    pol.sandbox.require = Requirement::kFull;
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_FALSE(c->plan.limits.nproc.has_value());
    EXPECT_FALSE(c->plan.limits.pids_max.has_value());
  }
}

TEST(Confine, ADelegatedCgroupIsNamedInTheResourcesFacet) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.resources.memory_limit_bytes = 1ull << 30;
  pol.resources.max_processes = 64;
  HostCaps host = FullHost();
  host.cgroups.probed = true;
  host.cgroups.can_create_children = true;
  host.cgroups.delegated = {{"memory", "v1"}, {"pids", "v1"}};
  // memory from setup-delegation's directory, pids from our own cgroup.
  host.cgroups.delegation = {{"memory", "/sys/fs/cgroup/memory/ci/agentbox-delegate-u"}};
  auto c = Confine({"true"}, pol, host, Inv());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->enforcement.level, Level::kFull);
  const FacetReport* res = FacetNamed(c->enforcement, "resources");
  ASSERT_NE(res, nullptr);
  EXPECT_NE(std::find(res->mechanisms.begin(), res->mechanisms.end(), "cgroup-v1-memory"), res->mechanisms.end());
  EXPECT_NE(std::find(res->mechanisms.begin(), res->mechanisms.end(), "cgroup-v1-pids"), res->mechanisms.end());
  EXPECT_NE(std::find(res->notes.begin(), res->notes.end(),
                      "memory: delegated by setup-delegation at /sys/fs/cgroup/memory/ci/agentbox-delegate-u"),
            res->notes.end());
  for (const auto& n : res->notes) EXPECT_EQ(n.find("pids: delegated"), std::string::npos) << n;
  EXPECT_EQ(c->plan.limits.pids_max, std::optional<std::uint64_t>(64));
}

TEST(Confine, WallClockIsEnforcedBySupervisor) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.resources.wall_clock_ms = 30000;
  auto c = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->enforcement.level, Level::kFull);
  EXPECT_EQ(c->plan.timeout_ms, std::optional<std::uint64_t>(30000));
  const FacetReport* res = FacetNamed(c->enforcement, "resources");
  ASSERT_NE(res, nullptr);
  EXPECT_TRUE(res->requested);
  EXPECT_EQ(res->level, Level::kFull);
}

TEST(Confine, NetworkAllowlistGoesThroughTheProxy) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.network.allow = {"github.com"};
  auto c = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_TRUE(c->plan.network.proxy.has_value());
  EXPECT_EQ(c->plan.network.proxy->http_port, 3128);
  EXPECT_EQ(c->plan.network.proxy->socks_port, 1080);
  EXPECT_EQ(c->plan.network.allow, std::vector<std::string>{"github.com"});
  auto env = [&](const std::string& name) {
    for (const auto& [k, v] : c->plan.env.set) {
      if (k == name) return v;
    }
    return std::string();
  };
  EXPECT_EQ(env("HTTP_PROXY"), "http://127.0.0.1:3128");
  EXPECT_EQ(env("https_proxy"), "http://127.0.0.1:3128");
  EXPECT_EQ(env("ALL_PROXY"), "socks5h://127.0.0.1:1080");
  EXPECT_EQ(env("NO_PROXY"), "localhost,127.0.0.1");
  const FacetReport* net = FacetNamed(c->enforcement, "network");
  ASSERT_NE(net, nullptr);
  EXPECT_EQ(net->level, Level::kFull);
  EXPECT_EQ(net->mechanisms,
            (std::vector<std::string>{"network-namespace", "connect-broker", "dns-inside", "egress-proxy"}));
  EXPECT_TRUE(c->plan.network.broker);
  EXPECT_EQ(c->plan.network.dns_address, "127.0.0.1");
  // The plan survives the trip through `wrap`.
  auto back = PlanFromJson(PlanToJson(c->plan));
  ASSERT_TRUE(back.ok());
  ASSERT_TRUE(back->network.proxy.has_value());
  EXPECT_EQ(back->network.allow, c->plan.network.allow);
  EXPECT_TRUE(back->network.sni_check);
  EXPECT_EQ(back->network.sni_ports, std::vector<std::uint16_t>{443});
}

TEST(Confine, EscalationCeilingReachesThePlanAndSurvivesJson) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  auto off = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_TRUE(off.ok()) << off.status().message();
  EXPECT_FALSE(off->plan.escalation.offers);  // escalation: deny, the default
  auto off_back = PlanFromJson(PlanToJson(off->plan));
  ASSERT_TRUE(off_back.ok());
  EXPECT_FALSE(off_back->escalation.offers);

  pol.on_violation.escalation = Escalation::kOneTimeApproval;
  pol.on_violation.max_grant.network = {"registry.example:443"};
  pol.on_violation.max_grant.filesystem_read = {"~/src", "/opt/data"};
  pol.on_violation.max_grant.filesystem_write = {"~/src"};
  pol.on_violation.max_grant.syscalls = {"ptrace"};
  pol.on_violation.max_grant.memory_bytes = 8ULL << 30;
  Invocation inv = Inv();
  inv.own_dirs = {"/home/u/.local/state/agentbox"};
  auto c = Confine({"true"}, pol, FullHost(), inv);
  ASSERT_TRUE(c.ok()) << c.status().message();
  const EscalationPlan& e = c->plan.escalation;
  EXPECT_TRUE(e.offers);
  EXPECT_EQ(e.network, (std::vector<std::string>{"registry.example:443"}));
  EXPECT_EQ(e.filesystem_read, (std::vector<std::string>{"/home/u/src", "/opt/data"}));
  EXPECT_EQ(e.filesystem_write, (std::vector<std::string>{"/home/u/src"}));
  EXPECT_EQ(e.syscalls, (std::vector<std::string>{"ptrace"}));
  EXPECT_EQ(e.memory_max_bytes, std::optional<std::uint64_t>(8ULL << 30));
  auto has = [](const std::vector<std::string>& v, const std::string& x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  EXPECT_TRUE(has(e.never, "/home/u/.ssh"));
  EXPECT_TRUE(has(e.never, "**/.env"));
  EXPECT_TRUE(has(e.never, "/home/u/.local/state/agentbox"));
  EXPECT_TRUE(has(e.protect, "/home/u/proj/.git/hooks"));
  EXPECT_TRUE(has(e.protect, "/home/u/proj/.git/config"));

  // The plan travels as JSON to a session's world process.
  auto back = PlanFromJson(PlanToJson(c->plan));
  ASSERT_TRUE(back.ok()) << back.status().message();
  const EscalationPlan& b = back->escalation;
  EXPECT_TRUE(b.offers);
  EXPECT_EQ(b.network, e.network);
  EXPECT_EQ(b.filesystem_read, e.filesystem_read);
  EXPECT_EQ(b.filesystem_write, e.filesystem_write);
  EXPECT_EQ(b.syscalls, e.syscalls);
  EXPECT_EQ(b.memory_max_bytes, e.memory_max_bytes);
  EXPECT_EQ(b.never, e.never);
  EXPECT_EQ(b.protect, e.protect);

  pol.on_violation.max_grant.memory_bytes.reset();
  auto no_memory = Confine({"true"}, pol, FullHost(), inv);
  ASSERT_TRUE(no_memory.ok());
  auto no_memory_back = PlanFromJson(PlanToJson(no_memory->plan));
  ASSERT_TRUE(no_memory_back.ok());
  EXPECT_FALSE(no_memory_back->escalation.memory_max_bytes.has_value());
}

TEST(Confine, TlsSniSwitchReachesThePlan) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.network.allow = {"github.com"};
  pol.network.tls_sni_check = false;
  pol.network.tls_sni_ports = {443, 8443};
  auto c = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_FALSE(c->plan.network.sni_check);
  EXPECT_EQ(c->plan.network.sni_ports, (std::vector<std::uint16_t>{443, 8443}));
  auto back = PlanFromJson(PlanToJson(c->plan));
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->network.sni_check);
  EXPECT_EQ(back->network.sni_ports, (std::vector<std::uint16_t>{443, 8443}));
}

TEST(Confine, InspectTlsReachesThePlan) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.network.allow = {"github.com", "*.example.com"};
  auto none = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_FALSE(none->plan.network.inspect_tls_all);
  EXPECT_TRUE(none->plan.network.inspect_tls.empty());

  pol.network.inspect_tls = {"github.com", "*.example.com"};
  auto hosts = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_TRUE(hosts.ok()) << hosts.status().message();
  EXPECT_FALSE(hosts->plan.network.inspect_tls_all);
  EXPECT_EQ(hosts->plan.network.inspect_tls, (std::vector<std::string>{"github.com", "*.example.com"}));
  auto back = PlanFromJson(PlanToJson(hosts->plan));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->network.inspect_tls, hosts->plan.network.inspect_tls);

  pol.network.inspect_tls.clear();
  pol.network.inspect_tls_all = true;
  auto all = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_TRUE(all->plan.network.inspect_tls_all);
  EXPECT_TRUE(all->plan.network.inspect_tls.empty());
}

// What `policy explain` prints about connections the broker installs.
TEST(DescribeBrokeredTls, SaysWhereFrontingIsPossibleAndWhoKeepsTheCheck) {
  NetworkPlan n;
  EXPECT_EQ(DescribeBrokeredTls(n), "") << "no broker, nothing installed directly";
  n.broker = true;
  const std::string none = DescribeBrokeredTls(n);
  EXPECT_NE(none.find("connections the broker installs directly carry no SNI check"), std::string::npos) << none;
  EXPECT_NE(none.find("domain fronting to another tenant of an allowed address is possible there"),
            std::string::npos)
      << none;
  EXPECT_NE(none.find("network.inspect_tls lists the hosts that keep the relay and the SNI check: none"),
            std::string::npos)
      << none;

  n.inspect_tls = {"github.com", "*.example.com"};
  const std::string hosts = DescribeBrokeredTls(n);
  EXPECT_NE(hosts.find("keep the relay and the SNI check: github.com, *.example.com"), std::string::npos) << hosts;

  n.inspect_tls.clear();
  n.inspect_tls_all = true;
  const std::string all = DescribeBrokeredTls(n);
  EXPECT_NE(all.find("all hosts keep the relay and the SNI check"), std::string::npos) << all;

  // With the check off everywhere the SNI line says so already.
  n.inspect_tls_all = false;
  n.sni_check = false;
  EXPECT_EQ(DescribeBrokeredTls(n), "");
}

TEST(Confine, PolicyProxyVariablesWin) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.network.egress_proxy = true;
  pol.env.set = {{"HTTP_PROXY", "http://elsewhere:8080"}};
  auto c = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_TRUE(c.ok()) << c.status().message();
  int n = 0;
  for (const auto& [k, v] : c->plan.env.set) {
    if (k == "HTTP_PROXY") {
      ++n;
      EXPECT_EQ(v, "http://elsewhere:8080");
    }
  }
  EXPECT_EQ(n, 1);
}

TEST(Confine, NoProxyWithoutNetworkNeeds) {
  auto c = Confine({"true"}, PresetFor(Mode::kWorkspaceWrite), FullHost(), Inv());
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->plan.network.proxy.has_value());
  for (const auto& [k, v] : c->plan.env.set) EXPECT_NE(k, "HTTP_PROXY");
}

TEST(Confine, TheToolGatewaysCredentialProxyFailsClosed) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.credentials.tools = ToolCredentials::kVaultProxy;
  auto c = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("credentials.tools: vault_proxy"), std::string::npos) << c.status().message();
}

// Secrets (and git: proxy) are the TLS terminator's: the plan turns it on,
// places the CA bundle as a read-only file, points the trust variables at
// it, and the credentials facet names it; no secret value is anywhere in it.
TEST(Confine, SecretsPlanTheTerminatorTheCaBundleAndTheTrustVariables) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.network.allow = {"api.github.com"};
  pol.credentials.git = GitCredentials::kProxy;
  SecretSpec secret;
  secret.name = "github";
  secret.from.kind = SecretSource::Kind::kEnv;
  secret.from.env = "GH_TOKEN";
  secret.hosts = {"api.github.com"};
  pol.credentials.secrets = {secret};
  auto c = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const Plan& plan = c->plan;
  EXPECT_TRUE(plan.network.terminate);
  ASSERT_EQ(plan.network.credentials.secrets.size(), 1u);
  EXPECT_EQ(plan.network.ca_bundle, "/run/agentbox/ca-bundle.pem");
  auto file = std::find_if(plan.mounts.begin(), plan.mounts.end(),
                           [](const MountOp& m) { return m.kind == MountKind::kFile; });
  ASSERT_NE(file, plan.mounts.end());
  EXPECT_EQ(file->target, plan.network.ca_bundle);
  EXPECT_TRUE(file->read_only);
  for (const char* name : {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO",
                           "CURL_CA_BUNDLE", "CARGO_HTTP_CAINFO", "PIP_CERT"}) {
    auto it = std::find_if(plan.env.set.begin(), plan.env.set.end(), [&](const auto& kv) { return kv.first == name; });
    ASSERT_NE(it, plan.env.set.end()) << name;
    EXPECT_EQ(it->second, plan.network.ca_bundle) << name;
  }
  EXPECT_TRUE(std::none_of(plan.env.pass.begin(), plan.env.pass.end(), [](const std::string& n) { return n == "GH_TOKEN"; }));
  const FacetReport* facet = FacetNamed(c->enforcement, "credentials");
  ASSERT_NE(facet, nullptr);
  const auto& cred = facet->mechanisms;
  EXPECT_EQ(facet->level, Level::kFull);
  EXPECT_NE(std::find(cred.begin(), cred.end(), "tls-terminator"), cred.end());
  EXPECT_NE(std::find(cred.begin(), cred.end(), "secrets-injected-at-egress"), cred.end());
  // Landlock lets the bundle be read, and only read.
  auto rule = std::find_if(plan.landlock.rules.begin(), plan.landlock.rules.end(),
                           [&](const auto& r) { return r.path == plan.network.ca_bundle; });
  ASSERT_NE(rule, plan.landlock.rules.end());
  EXPECT_EQ(rule->access & ~static_cast<std::uint64_t>(LANDLOCK_ACCESS_FS_READ_FILE), 0u);
  // The plan travels (wrap, sessions) and comes back the same.
  auto back = PlanFromJson(PlanToJson(plan));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->network.terminate);
  ASSERT_EQ(back->network.credentials.secrets.size(), 1u);
  EXPECT_EQ(back->network.credentials.secrets[0].from.env, "GH_TOKEN");
  EXPECT_EQ(back->network.credentials.secrets[0].hosts, secret.hosts);
}

TEST(Confine, GitProxyWithoutASecretRunsWithANote) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.credentials.git = GitCredentials::kProxy;
  auto c = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->plan.network.terminate);
}

TEST(Confine, OtherIsolationLevelsAreRefusedEvenWithPartial) {
  for (Isolation iso : {Isolation::kMicrovm, Isolation::kContainer, Isolation::kRemote}) {
    Policy pol = PresetFor(Mode::kWorkspaceWrite);
    pol.sandbox.isolation = iso;
    pol.sandbox.require = Requirement::kPartial;
    auto c = Confine({"true"}, pol, FullHost(), Inv());
    ASSERT_FALSE(c.ok()) << ToString(iso);
    EXPECT_NE(c.status().message().find(ToString(iso)), std::string::npos);
  }
}

TEST(Confine, ImageOtherThanHostIsRefused) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.sandbox.image = "agent-base:2026-09";
  auto c = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("agent-base:2026-09"), std::string::npos);
}

TEST(Confine, DangerFullAccessConfinesNothingAndSaysSo) {
  auto c = Confine({"true"}, PresetFor(Mode::kDangerFullAccess), NoUserns(), Inv());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->plan.confined);
  EXPECT_TRUE(c->plan.env.pass_all);
  EXPECT_EQ(c->enforcement.level, Level::kNone);
  EXPECT_EQ(c->enforcement.backend, "none");
  EXPECT_TRUE(c->plan.mounts.empty());
}

TEST(Confine, EmptyCommandIsRefused) {
  auto c = Confine({}, PresetFor(Mode::kWorkspaceWrite), FullHost(), Inv());
  ASSERT_FALSE(c.ok());
}

TEST(Confine, WrappedArgvCarriesThePlanInTheEnvironment) {
  auto c = Confine({"npm", "test"}, PresetFor(Mode::kWorkspaceWrite), FullHost(), Inv());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->argv, (std::vector<std::string>{"/usr/bin/agentbox", "__exec", "--", "npm", "test"}));
  ASSERT_EQ(c->env.size(), 1u);
  EXPECT_EQ(c->env[0].first, kPlanEnv);
  auto plan = PlanFromJson(c->env[0].second);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(PlanToJson(*plan), PlanToJson(c->plan));
}

TEST(Confine, RunnerFailureRuleMatchesOnlyThisRunsNonce) {
  auto c = Confine({"true"}, PresetFor(Mode::kWorkspaceWrite), FullHost(), Inv());
  ASSERT_TRUE(c.ok());
  ASSERT_FALSE(c->runner_failure_rules.empty());
  std::regex rule(c->runner_failure_rules[0].pattern);
  EXPECT_TRUE(std::regex_search("agentbox: sandbox error [0123456789abcdef] stage=mount: x", rule));
  EXPECT_FALSE(std::regex_search("agentbox: sandbox error [ffffffffffffffff] stage=mount: x", rule));
}

TEST(Confine, DenialSignaturesRecogniseTypicalMessages) {
  auto c = Confine({"true"}, PresetFor(Mode::kWorkspaceWrite), FullHost(), Inv());
  ASSERT_TRUE(c.ok());
  auto matches = [&](const std::string& line) {
    for (const auto& s : c->denial_signatures) {
      if (std::regex_search(line, std::regex(s.pattern))) return true;
    }
    return false;
  };
  EXPECT_TRUE(matches("touch: cannot touch '/usr/x': Read-only file system"));
  EXPECT_TRUE(matches("sh: 1: cannot create /etc/x: Read-only file system"));
  EXPECT_TRUE(matches("cat: .env: Permission denied"));
  EXPECT_TRUE(matches("cat: sub/dir/.env: Permission denied"));
  EXPECT_TRUE(matches("cat: /home/u/.ssh/id_rsa: No such file or directory"));
  EXPECT_TRUE(matches("mv: cannot move '.git' to '.git2': Device or resource busy"));
  EXPECT_TRUE(matches("OSError: [Errno 30] Read-only file system: '/usr/lib/x'"));
  EXPECT_TRUE(matches("PermissionError: [Errno 13] Permission denied: '.env'"));
  EXPECT_TRUE(matches("FileNotFoundError: [Errno 2] No such file or directory: '/home/u/.ssh/id_rsa'"));
  EXPECT_TRUE(matches("Error: EACCES: permission denied, open '.env'"));
  EXPECT_TRUE(matches("Error: EROFS: read-only file system, open '/usr/x'"));
  EXPECT_TRUE(matches("Error: ENOENT: no such file or directory, open '/home/u/.aws/credentials'"));
  EXPECT_TRUE(matches("rm: cannot remove '.env': Device or resource busy"));
  EXPECT_TRUE(matches("error: could not lock config file .git/config: Read-only file system"));
  // Ordinary failures are not denials.
  EXPECT_FALSE(matches("cat: missing.txt: No such file or directory"));
  EXPECT_FALSE(matches("make: *** [Makefile:3: all] Error 1"));
  EXPECT_FALSE(matches("src/main.c:3: error: expected ';'"));
  EXPECT_FALSE(matches("FileNotFoundError: [Errno 2] No such file or directory: 'data.csv'"));
  EXPECT_FALSE(matches("Error: ENOENT: no such file or directory, open 'package.json'"));
}

TEST(Confine, DenialSignatureNamesTheMostSpecificRule) {
  auto c = Confine({"true"}, PresetFor(Mode::kWorkspaceWrite), FullHost(), Inv());
  ASSERT_TRUE(c.ok());
  auto first = [&](const std::string& line) -> std::string {
    for (const auto& s : c->denial_signatures) {
      if (std::regex_search(line, std::regex(s.pattern))) return s.meaning;
    }
    return "";
  };
  EXPECT_NE(first("sh: 1: cannot create .git/hooks/pre-commit: Read-only file system").find("filesystem.protect"),
            std::string::npos);
  EXPECT_NE(first("cat: .env: Permission denied").find("**/.env"), std::string::npos);
  EXPECT_EQ(first("touch: cannot touch '/usr/x': Read-only file system"), "write to a read-only path");
}

TEST(Confine, ValuesHonouredDifferentlyAreNotedNotSilent) {
  Policy pol = PresetFor(Mode::kWorkspaceWrite);
  pol.sandbox.fresh_per_task = false;
  pol.network.deny = {"evil.example"};
  pol.on_violation.escalation = Escalation::kOneTimeApproval;
  pol.on_violation.report_as = ReportAs::kTaskFailure;
  auto c = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_TRUE(c.ok());
  const auto& notes = c->enforcement.notes;
  ASSERT_EQ(notes.size(), 4u);
  EXPECT_NE(notes[0].find("fresh_per_task"), std::string::npos);
  EXPECT_NE(notes[1].find("network.deny"), std::string::npos);
  EXPECT_NE(notes[2].find("one_time_approval"), std::string::npos);
  EXPECT_NE(notes[2].find("escalation offer"), std::string::npos) << notes[2];
  EXPECT_NE(notes[2].find("POST /v1/sessions/{id}/escalations"), std::string::npos) << notes[2];
  EXPECT_NE(notes[3].find("task_failure"), std::string::npos);
  EXPECT_FALSE(c->plan.denial_outcome);
}

TEST(Confine, DangerFullAccessKeepsEnvSetAndTheWallClock) {
  Policy pol = PresetFor(Mode::kDangerFullAccess);
  pol.env.set = {{"CI", "1"}};
  pol.resources.wall_clock_ms = 5000;
  auto c = Confine({"true"}, pol, FullHost(), Inv());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->plan.env.set, (std::vector<std::pair<std::string, std::string>>{{"CI", "1"}}));
  EXPECT_EQ(c->plan.timeout_ms, std::optional<std::uint64_t>(5000));
  const FacetReport* res = FacetNamed(c->enforcement, "resources");
  ASSERT_NE(res, nullptr);
  EXPECT_EQ(res->level, Level::kFull);
  EXPECT_EQ(c->enforcement.level, Level::kNone);
}

TEST(Glob, GitignoreSemantics) {
  EXPECT_TRUE(GlobMatch("**/.env", ".env"));
  EXPECT_TRUE(GlobMatch("**/.env", "a/b/.env"));
  EXPECT_FALSE(GlobMatch("**/.env", "a/b/.envrc"));
  EXPECT_TRUE(GlobMatch(".env", "deep/er/.env"));  // no slash: any depth
  EXPECT_TRUE(GlobMatch("*.pem", "certs/server.pem"));
  EXPECT_TRUE(GlobMatch("secrets/**", "secrets/a/b"));
  EXPECT_FALSE(GlobMatch("secrets/*", "other/secrets/a"));
  EXPECT_TRUE(GlobMatch("a/**/z", "a/z"));
  EXPECT_TRUE(GlobMatch("a/**/z", "a/b/c/z"));
  EXPECT_FALSE(GlobMatch("a/*/z", "a/b/c/z"));
  EXPECT_TRUE(GlobMatch("/top.txt", "top.txt"));
  EXPECT_FALSE(GlobMatch("/top.txt", "sub/top.txt"));
  EXPECT_TRUE(GlobMatch("id_[rd]sa", "home/.ssh/id_rsa"));
  EXPECT_TRUE(GlobMatch("*", ".hidden"));  // gitignore: * matches dot files
}

TEST(PlanJson, RoundTripsAndRejectsGarbage) {
  auto c = Confine({"a", "b c"}, PresetFor(Mode::kWorkspaceWrite), FullHost(), Inv());
  ASSERT_TRUE(c.ok());
  auto back = PlanFromJson(PlanToJson(c->plan));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(PlanToJson(*back), PlanToJson(c->plan));
  EXPECT_EQ(back->protect_git, (std::vector<std::string>{"hooks", "config"}));
  EXPECT_FALSE(PlanFromJson("{").ok());
  EXPECT_FALSE(PlanFromJson("{\"confined\": true}").ok());
  EXPECT_FALSE(PlanFromJson("[]").ok());
}

}  // namespace
}  // namespace agentbox

namespace agentbox {
namespace {

// ------------------------------------------- disk_gib and the host workspace

Policy WithDisk(Mode mode = Mode::kWorkspaceWrite) {
  Policy p = PresetFor(mode);
  p.resources.disk_bytes = 100ull << 20;
  p.sandbox.require = Requirement::kPartial;
  return p;
}

std::string MissingResources(const EnforcementReport& r) {
  std::string out;
  for (const auto& m : r.missing) {
    if (m.facet == "resources") out += m.reason + "\n";
  }
  return out;
}

TEST(WorkspaceDisk, WithoutABoundTheWorkspaceIsMissing) {
  Invocation inv = testing::FakeInvocation();
  inv.workspace_fs.known = true;
  inv.workspace_fs.fstype = "ext4";
  EnforcementReport r = AssessEnforcement(WithDisk(), FullHost(), inv);
  EXPECT_EQ(MissingResources(r),
            "disk_gib: the workspace /home/u/proj is on ext4 without project quotas: total disk use in it is not "
            "limited; --workspace-overlay bounds it\n");
  EXPECT_EQ(FacetNamed(r, "resources")->level, Level::kPartial);
  Policy full = WithDisk();
  full.sandbox.require = Requirement::kFull;
  auto refused = Confine({"true"}, full, FullHost(), inv);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("disk_gib: the workspace /home/u/proj"), std::string::npos);
}

TEST(WorkspaceDisk, TheReasonAProjectQuotaIsNotUsedIsSaid) {
  Invocation inv = testing::FakeInvocation();
  inv.workspace_fs.known = true;
  inv.workspace_fs.fstype = "xfs";
  inv.workspace_fs.why_not = "with project quotas, but setting one needs root";
  EXPECT_NE(MissingResources(AssessEnforcement(WithDisk(), FullHost(), inv))
                .find("is on xfs with project quotas, but setting one needs root: total disk use"),
            std::string::npos);
}

TEST(WorkspaceDisk, AProjectQuotaBoundsItWhereTheFilesystemHasOne) {
  Invocation inv = testing::FakeInvocation();
  inv.workspace_fs.known = true;
  inv.workspace_fs.fstype = "ext4";
  inv.workspace_fs.project_quota = true;
  inv.workspace_fs.device = "/dev/loop7";
  Policy p = WithDisk();
  p.sandbox.require = Requirement::kFull;
  auto c = Confine({"true"}, p, FullHost(), inv);
  ASSERT_TRUE(c.ok()) << c.status().message();
  const auto& mech = FacetNamed(c->enforcement, "resources")->mechanisms;
  EXPECT_NE(std::find(mech.begin(), mech.end(), "project-quota"), mech.end());
  ASSERT_TRUE(c->plan.workspace_quota);
  EXPECT_EQ(c->plan.workspace_quota->device, "/dev/loop7");
  EXPECT_EQ(c->plan.workspace_quota->bytes, 100ull << 20);
  auto back = PlanFromJson(PlanToJson(c->plan));
  ASSERT_TRUE(back.ok() && back->workspace_quota);
  EXPECT_EQ(back->workspace_quota->device, "/dev/loop7");
  // Without disk_gib, nothing is tagged.
  p.resources.disk_bytes.reset();
  auto none = Confine({"true"}, p, FullHost(), inv);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->plan.workspace_quota);
}

TEST(WorkspaceDisk, ReadOnlyWorkspaceAndSessionsAreNotAsked) {
  Invocation inv = testing::FakeInvocation();
  EXPECT_EQ(MissingResources(AssessEnforcement(WithDisk(Mode::kReadOnly), FullHost(), inv)), "");
  inv.session = true;
  EXPECT_EQ(MissingResources(AssessEnforcement(WithDisk(), FullHost(), inv)), "");
}

TEST(WorkspaceDisk, OverlayBoundsItWithATmpfsOfDiskGib) {
  Invocation inv = testing::FakeInvocation();
  inv.workspace_overlay = OverlayApply::kAlways;
  Policy p = WithDisk();
  p.sandbox.require = Requirement::kFull;
  auto c = Confine({"true"}, p, FullHost(), inv);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(MissingResources(c->enforcement), "");
  const auto& mech = FacetNamed(c->enforcement, "resources")->mechanisms;
  EXPECT_NE(std::find(mech.begin(), mech.end(), "workspace-overlay"), mech.end());
  const MountOp* ws = Find(c->plan, MountKind::kOverlay, "/home/u/proj");
  ASSERT_NE(ws, nullptr);
  EXPECT_EQ(ws->source, "/home/u/proj");
  EXPECT_EQ(Find(c->plan, MountKind::kBind, "/home/u/proj"), nullptr);
  ASSERT_TRUE(c->plan.workspace_overlay);
  EXPECT_EQ(c->plan.workspace_overlay->tmpfs_bytes, 100ull << 20);
  EXPECT_EQ(c->plan.workspace_overlay->apply, OverlayApply::kAlways);
  // Through `wrap`: the plan carries it.
  auto back = PlanFromJson(PlanToJson(c->plan));
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_TRUE(back->workspace_overlay);
  EXPECT_EQ(back->workspace_overlay->tmpfs_bytes, 100ull << 20);
  EXPECT_EQ(back->workspace_overlay->apply, OverlayApply::kAlways);
}

TEST(WorkspaceDisk, OverlayIsRefusedWhereItCannotBe) {
  Invocation inv = testing::FakeInvocation();
  inv.workspace_overlay = OverlayApply::kOnSuccess;
  inv.backend = BackendChoice::kLandlock;
  auto landlock = Confine({"true"}, WithDisk(), FullHost(), inv);
  ASSERT_FALSE(landlock.ok());
  EXPECT_NE(landlock.status().message().find("--workspace-overlay needs the namespaces backend"), std::string::npos);
  inv.backend = BackendChoice::kAuto;
  auto read_only = Confine({"true"}, WithDisk(Mode::kReadOnly), FullHost(), inv);
  ASSERT_FALSE(read_only.ok());
  EXPECT_NE(read_only.status().message().find("read-only"), std::string::npos);
}

}  // namespace
}  // namespace agentbox

namespace agentbox {
namespace {

Policy WithHostTrees() {
  Policy p = PresetFor(Mode::kWorkspaceWrite);
  p.filesystem.read_write = {"~/repos/x.git", "/srv/shared"};
  p.filesystem.caches = {{"npm", "~/.npm", ""}, {"pip", "/pip-cache", "~/.cache/pip"}};
  p.home.import = {".gitconfig"};
  p.filesystem.deny.push_back("/srv/shared/secret");
  p.filesystem.protect.push_back("/srv/shared/hooks/post");
  return p;
}

TEST(ConfineHostTrees, ReadWriteCachesAndImportsAreBindsWithTheirLandlockRights) {
  Invocation inv = Inv();
  inv.cache_dir = "/home/u/.cache/agentbox";
  auto c = Confine({"true"}, WithHostTrees(), FullHost(), inv);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const Plan& p = c->plan;
  const MountOp* rw = Find(p, MountKind::kBind, "/home/u/repos/x.git");
  ASSERT_NE(rw, nullptr);
  EXPECT_FALSE(rw->read_only);
  EXPECT_FALSE(rw->optional) << "a writable tree asked for never silently vanishes";
  // After the private HOME's tmpfs, which it lies in.
  EXPECT_GT(IndexOf(p, "/home/u/repos/x.git"), IndexOf(p, "/home/u"));
  const MountOp* npm = Find(p, MountKind::kBind, "/home/u/.npm");
  ASSERT_NE(npm, nullptr);
  EXPECT_EQ(npm->source, "/home/u/.cache/agentbox/caches/npm");
  EXPECT_EQ(p.cache_dirs, (std::vector<std::string>{"/home/u/.cache/agentbox/caches/npm"}));
  const MountOp* pip = Find(p, MountKind::kBind, "/pip-cache");
  ASSERT_NE(pip, nullptr);
  EXPECT_EQ(pip->source, "/home/u/.cache/pip");
  const MountOp* gitconfig = Find(p, MountKind::kBind, "/home/u/.gitconfig");
  ASSERT_NE(gitconfig, nullptr);
  EXPECT_TRUE(gitconfig->read_only);
  EXPECT_TRUE(gitconfig->optional);
  // deny inside a read_write tree is masked; protect is bound read-only, its ancestor pinned.
  EXPECT_NE(Find(p, MountKind::kMask, "/srv/shared/secret"), nullptr);
  const MountOp* hook = Find(p, MountKind::kBind, "/srv/shared/hooks/post");
  ASSERT_NE(hook, nullptr);
  EXPECT_TRUE(hook->read_only);
  EXPECT_NE(Find(p, MountKind::kPin, "/srv/shared/hooks"), nullptr);
  for (const auto& rule : p.landlock.rules) {
    if (rule.path == "/srv/shared") { EXPECT_TRUE(rule.access & LANDLOCK_ACCESS_FS_WRITE_FILE); }
    if (rule.path == "/home/u/.gitconfig") { EXPECT_FALSE(rule.access & LANDLOCK_ACCESS_FS_WRITE_FILE); }
  }
  const FacetReport* fs = FacetNamed(c->enforcement, "filesystem");
  ASSERT_NE(fs, nullptr);
  std::string notes;
  for (const auto& n : fs->notes) notes += n + "\n";
  EXPECT_NE(notes.find("filesystem.read_write, writable outside the workspace: /home/u/repos/x.git, /srv/shared"),
            std::string::npos)
      << notes;
  EXPECT_NE(notes.find("npm: ~/.npm from /home/u/.cache/agentbox/caches/npm"), std::string::npos) << notes;
}

TEST(ConfineHostTrees, RefusalsNameTheEntry) {
  Invocation inv = Inv();
  inv.cache_dir = "/home/u/.cache/agentbox";
  Policy denied = PresetFor(Mode::kWorkspaceWrite);
  denied.home.import = {".aws/config"};
  auto c = Confine({"true"}, denied, FullHost(), inv);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("home.import '.aws/config' (/home/u/.aws/config) overlaps filesystem.deny "
                                      "'~/.aws'"),
            std::string::npos)
      << c.status().message();

  Policy cache = PresetFor(Mode::kWorkspaceWrite);
  cache.filesystem.caches = {{"npm", "~/.npm", ""}};
  inv.cache_dir.clear();
  c = Confine({"true"}, cache, FullHost(), inv);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("filesystem.caches.npm: agentbox has no cache directory"), std::string::npos)
      << c.status().message();

  Policy own = PresetFor(Mode::kWorkspaceWrite);
  own.filesystem.read_write = {"~/.local/state/agentbox/sessions"};
  inv.own_dirs = {"/home/u/.local/state/agentbox"};
  c = Confine({"true"}, own, FullHost(), inv);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("filesystem.read_write '~/.local/state/agentbox/sessions'"), std::string::npos)
      << c.status().message();
}

}  // namespace
}  // namespace agentbox
