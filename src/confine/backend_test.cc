// Backend selection and the landlock-only plan, against fake hosts.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "agentbox/confine.h"
#include "agentbox/plan.h"
#include "agentbox/policy.h"
#include "confine/fake_host.h"
#include "confine/layers.h"
#include "linux/compat.h"

namespace agentbox {
namespace {

using testing::Rule;

HostCaps Host(bool userns, int landlock_abi = 7, bool seccomp = true) {
  HostCaps h = testing::FakeHost(userns, landlock_abi, seccomp);
  if (!userns) h.userns_reason = "kernel.apparmor_restrict_unprivileged_userns is 1";
  return h;
}

Invocation InvWith(BackendChoice backend = BackendChoice::kAuto) {
  Invocation inv = testing::FakeInvocation();
  inv.runtime_dir = "/run/user/1000";
  inv.backend = backend;
  return inv;
}

Policy Partial(Mode mode = Mode::kWorkspaceWrite) {
  Policy p = PresetFor(mode);
  p.sandbox.require = Requirement::kPartial;
  return p;
}

bool Missing(const EnforcementReport& r, const std::string& facet, const std::string& text) {
  return std::any_of(r.missing.begin(), r.missing.end(), [&](const MissingFacet& m) {
    return m.facet == facet && m.reason.find(text) != std::string::npos;
  });
}

TEST(SelectBackend, AutomaticChoice) {
  auto ns = SelectBackend(Host(true), BackendChoice::kAuto);
  ASSERT_TRUE(ns.ok());
  EXPECT_EQ(ns->backend, Backend::kNamespaces);
  auto ll = SelectBackend(Host(false), BackendChoice::kAuto);
  ASSERT_TRUE(ll.ok());
  EXPECT_EQ(ll->backend, Backend::kLandlockOnly);
  EXPECT_EQ(ll->why, "user namespaces unavailable: kernel.apparmor_restrict_unprivileged_userns is 1");
  EXPECT_FALSE(SelectBackend(Host(false, 1), BackendChoice::kAuto).ok());  // no refer right
  EXPECT_FALSE(SelectBackend(Host(false, 7, false), BackendChoice::kAuto).ok());
}

TEST(SelectBackend, ForcedChoiceIsAnErrorNotADowngrade) {
  auto forced = SelectBackend(Host(false), BackendChoice::kNamespaces);
  ASSERT_FALSE(forced.ok());
  EXPECT_NE(forced.status().message().find("apparmor_restrict"), std::string::npos);
  auto c = Confine({"true"}, Partial(), Host(false), InvWith(BackendChoice::kNamespaces));
  EXPECT_FALSE(c.ok());
  auto ll = SelectBackend(Host(true), BackendChoice::kLandlock);
  ASSERT_TRUE(ll.ok());
  EXPECT_EQ(ll->backend, Backend::kLandlockOnly);
  EXPECT_FALSE(SelectBackend(Host(true, 0), BackendChoice::kLandlock).ok());
}

TEST(LandlockOnly, RefusedUnderRequireFullWithTheMissingList) {
  Policy p = PresetFor(Mode::kWorkspaceWrite);
  auto c = Confine({"true"}, p, Host(false), InvWith());
  ASSERT_FALSE(c.ok());
  const std::string& msg = c.status().message();
  for (const char* want : {"processes:", "no private /tmp", "'**/.env'", "'.git/hooks'"}) {
    EXPECT_NE(msg.find(want), std::string::npos) << want << "\n" << msg;
  }
}

TEST(LandlockOnly, MissingFacetsListedExactly) {
  auto c = Confine({"true"}, Partial(), Host(false), InvWith());
  ASSERT_TRUE(c.ok()) << c.status().message();
  const EnforcementReport& r = c->enforcement;
  EXPECT_EQ(r.backend, "landlock-only");
  EXPECT_EQ(r.level, Level::kPartial);
  EXPECT_TRUE(Missing(r, "processes", "host processes are visible in /proc"));
  EXPECT_TRUE(Missing(r, "processes", "Landlock scoping (ABI 6)"));
  // The network is fenced in full on ABI 7: Landlock's TCP rules, the
  // socket filter and the connect() mediation.
  EXPECT_FALSE(Missing(r, "network", "")) << ToJson(r);
  EXPECT_TRUE(Missing(r, "filesystem", "no private /tmp"));
  // Inside allowed trees: listed by name. Outside: absent by construction.
  EXPECT_TRUE(Missing(r, "credentials",
                      "filesystem.deny '**/.env' (/home/u/proj/**/.env) is not fenced: it lies in the workspace "
                      "/home/u/proj"));
  EXPECT_TRUE(Missing(r, "credentials",
                      "filesystem.deny '/etc/shadow' is not fenced: it lies in the read_only entry /etc"));
  EXPECT_TRUE(Missing(r, "filesystem", "filesystem.protect '.git/hooks' stays writable"));
  EXPECT_FALSE(Missing(r, "credentials", "'~/.ssh'"));
  EXPECT_FALSE(Missing(r, "filesystem", "'~/.ssh'"));
  const auto& absent = c->plan.absent;
  EXPECT_NE(std::find(absent.begin(), absent.end(), "/home/u/.ssh"), absent.end());
  // Nothing about syscalls is lost.
  EXPECT_FALSE(Missing(r, "syscalls", ""));
}

const FacetReport* FacetOf(const EnforcementReport& r, const std::string& name) {
  for (const auto& f : r.facets) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// A deny entry the backend cannot hide leaves the credentials facet short
// of full, with the entry named, so that `--require full` refuses.
TEST(LandlockOnly, CredentialsFacetIsPartialWhenADenyEntryStaysReadable) {
  auto c = Confine({"true"}, Partial(), Host(false), InvWith());
  ASSERT_TRUE(c.ok()) << c.status().message();
  const FacetReport* cred = FacetOf(c->enforcement, "credentials");
  ASSERT_NE(cred, nullptr);
  EXPECT_EQ(cred->level, Level::kPartial);
  // `check` knows no workspace: a workspace-relative entry is inside it all the same.
  EnforcementReport checked = AssessEnforcement(Partial(), Host(false));
  ASSERT_NE(FacetOf(checked, "credentials"), nullptr);
  EXPECT_EQ(FacetOf(checked, "credentials")->level, Level::kPartial);
  EXPECT_TRUE(Missing(checked, "credentials", "filesystem.deny '**/.env' is not fenced: it lies in the workspace"));
  // Deny entries all outside the granted trees: nothing to name, full.
  Policy outside = Partial();
  outside.filesystem.deny = {"~/.ssh", "~/.aws"};
  auto o = Confine({"true"}, outside, Host(false), InvWith());
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(FacetOf(o->enforcement, "credentials")->level, Level::kFull);
  EXPECT_FALSE(Missing(o->enforcement, "credentials", ""));
  // The namespaces backend masks what the landlock-only one cannot.
  auto ns = Confine({"true"}, Partial(), Host(true), InvWith());
  ASSERT_TRUE(ns.ok()) << ns.status().message();
  EXPECT_EQ(FacetOf(ns->enforcement, "credentials")->level, Level::kFull);
  EXPECT_FALSE(Missing(ns->enforcement, "credentials", ""));
}

// Whatever the host, a facet named in `missing` never claims full, and the
// report is full only when nothing is missing.
TEST(AssessEnforcement, EveryFacetLevelFollowsWhatIsMissing) {
  std::vector<HostCaps> hosts = {Host(true), Host(false), Host(false, 3), Host(true, 0), Host(true, 7, false)};
  for (size_t i = 0; i < hosts.size(); ++i) {
    for (Mode mode : {Mode::kReadOnly, Mode::kWorkspaceWrite}) {
      Policy p = Partial(mode);
      p.resources.memory_limit_bytes = 1u << 30;
      p.resources.max_processes = 64;
      auto c = Confine({"true"}, p, hosts[i], InvWith());
      ASSERT_TRUE(c.ok()) << i << ": " << c.status().message();
      const EnforcementReport& r = c->enforcement;
      for (const auto& m : r.missing) {
        const FacetReport* f = FacetOf(r, m.facet);
        if (f) {
          EXPECT_NE(f->level, Level::kFull) << "host " << i << ": " << m.facet << ": " << m.reason;
        }
      }
      EXPECT_EQ(r.level == Level::kFull, r.missing.empty()) << "host " << i;
    }
  }
}

TEST(LandlockOnly, OlderAbisSayWhatTheyLose) {
  EnforcementReport r3 = AssessEnforcement(Partial(), Host(false, 3));
  EXPECT_TRUE(Missing(r3, "network", "cannot restrict TCP"));
  EXPECT_TRUE(Missing(r3, "processes", "signals to the user's own processes are not refused"));
  EnforcementReport r5 = AssessEnforcement(Partial(), Host(false, 5));
  EXPECT_TRUE(Missing(r5, "network", "abstract unix sockets"));
}

TEST(LandlockOnly, ReadOnlyModeHasNoProtectGapAndAReadOnlyWorkspace) {
  auto c = Confine({"true"}, Partial(Mode::kReadOnly), Host(false), InvWith());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_FALSE(Missing(c->enforcement, "filesystem", "filesystem.protect"));
  const LandlockRule* ws = Rule(c->plan, "/home/u/proj");
  ASSERT_NE(ws, nullptr);
  EXPECT_EQ(ws->access & LANDLOCK_ACCESS_FS_WRITE_FILE, 0u);
}

TEST(LandlockOnly, PlanHasNoNamespacesNoMountsAndHostPathRules) {
  auto c = Confine({"true"}, Partial(), Host(true), InvWith(BackendChoice::kLandlock));
  ASSERT_TRUE(c.ok()) << c.status().message();
  const Plan& p = c->plan;
  EXPECT_EQ(p.backend, Backend::kLandlockOnly);
  EXPECT_TRUE(p.namespaces.empty());
  EXPECT_TRUE(p.mounts.empty());
  EXPECT_TRUE(p.deny_globs.empty());
  EXPECT_EQ(p.cwd, "/home/u/proj/src");
  EXPECT_EQ(p.private_dir_parent, "/run/user/1000");
  EXPECT_TRUE(p.landlock.required);
  EXPECT_EQ(p.landlock.handled_net, LANDLOCK_ACCESS_NET_BIND_TCP | LANDLOCK_ACCESS_NET_CONNECT_TCP);
  EXPECT_EQ(p.landlock.scoped, LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL);
  const LandlockRule* usr = Rule(p, "/usr");
  ASSERT_NE(usr, nullptr);
  EXPECT_TRUE(usr->access & LANDLOCK_ACCESS_FS_EXECUTE);
  EXPECT_FALSE(usr->access & LANDLOCK_ACCESS_FS_WRITE_FILE);
  const LandlockRule* ws = Rule(p, "/home/u/proj");
  ASSERT_NE(ws, nullptr);
  EXPECT_TRUE(ws->access & LANDLOCK_ACCESS_FS_WRITE_FILE);
  const LandlockRule* proc = Rule(p, "/proc");
  ASSERT_NE(proc, nullptr);
  EXPECT_FALSE(proc->access & LANDLOCK_ACCESS_FS_WRITE_FILE);
  ASSERT_NE(Rule(p, "/dev/null"), nullptr);
  ASSERT_NE(Rule(p, "/dev/pts"), nullptr);
  EXPECT_EQ(Rule(p, "/home/u"), nullptr);  // HOME is not granted: ~/.ssh stays out
  EXPECT_EQ(Rule(p, "/tmp"), nullptr);
  // No HOME or TMPDIR until the run's private directory exists.
  for (const auto& [k, v] : p.env.set) EXPECT_TRUE(k != "HOME" && k != "TMPDIR") << k;
}

TEST(LandlockOnly, PrivateDirectoryGetsARuleAndTheEnvironment) {
  auto c = Confine({"true"}, Partial(), Host(false), InvWith());
  ASSERT_TRUE(c.ok());
  Plan p = c->plan;
  AdoptPrivateDir(&p, "/run/user/1000/agentbox-run-abc");
  const LandlockRule* dir = Rule(p, "/run/user/1000/agentbox-run-abc");
  ASSERT_NE(dir, nullptr);
  EXPECT_TRUE(dir->access & LANDLOCK_ACCESS_FS_MAKE_REG);
  auto has = [&](const std::string& k, const std::string& v) {
    return std::find(p.env.set.begin(), p.env.set.end(), std::make_pair(k, v)) != p.env.set.end();
  };
  EXPECT_TRUE(has("HOME", "/run/user/1000/agentbox-run-abc/home"));
  EXPECT_TRUE(has("TMPDIR", "/run/user/1000/agentbox-run-abc/tmp"));
  // The plan survives `wrap`.
  auto back = PlanFromJson(PlanToJson(p));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->backend, Backend::kLandlockOnly);
  EXPECT_EQ(back->private_dir, p.private_dir);
  EXPECT_EQ(back->landlock.handled_net, p.landlock.handled_net);
}

TEST(LandlockOnly, NamespacesBackendUnchangedWhereUserNamespacesExist) {
  auto c = Confine({"true"}, Partial(), Host(true), InvWith());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->enforcement.backend, "linux-namespaces");
  EXPECT_EQ(c->plan.backend, Backend::kNamespaces);
  EXPECT_FALSE(c->plan.namespaces.empty());
  EXPECT_EQ(c->plan.landlock.handled_net, 0u);
}

TEST(LandlockOnly, NetworkFacetIsFullWithoutANamespaceOnAbi4AndLater) {
  for (bool proxy : {false, true}) {
    Policy p = Partial();
    if (proxy) p.network.allow = {"github.com"};
    EnforcementReport r = AssessEnforcement(p, Host(false), BackendChoice::kAuto);
    const FacetReport* net = FacetOf(r, "network");
    ASSERT_NE(net, nullptr);
    EXPECT_EQ(net->level, Level::kFull) << ToJson(r);
    std::vector<std::string> want = {"landlock-net-tcp", "seccomp-socket-filter", "connect-mediation"};
    if (proxy) want.push_back("egress-proxy");
    EXPECT_EQ(net->mechanisms, want) << ToJson(r);
    EXPECT_FALSE(Missing(r, "network", "")) << ToJson(r);
    const bool says_visible = std::any_of(net->notes.begin(), net->notes.end(), [](const std::string& n) {
      return n.find("the host's interfaces, addresses and routes stay visible") != std::string::npos;
    });
    EXPECT_TRUE(says_visible) << ToJson(r);
  }
  // Below ABI 4 TCP has one fence only; below 6 abstract unix sockets none.
  EnforcementReport r3 = AssessEnforcement(Partial(), Host(false, 3));
  EXPECT_EQ(FacetOf(r3, "network")->level, Level::kPartial);
  EXPECT_EQ(FacetOf(r3, "network")->mechanisms, (std::vector<std::string>{"seccomp-socket-filter", "connect-mediation"}));
  EXPECT_TRUE(Missing(r3, "network", "Landlock ABI 3 < 4 cannot restrict TCP")) << ToJson(r3);
}

TEST(LandlockOnly, ProxyOnTheHostLoopbackWithPortsOfTheRun) {
  Policy p = PresetFor(Mode::kWorkspaceWrite);
  p.network.allow = {"github.com"};
  auto c = Confine({"true"}, Partial(), Host(false), InvWith());
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->plan.network.proxy.has_value());  // no network section, no proxy
  Policy relaxed = Partial();
  relaxed.network.allow = {"github.com"};
  auto with_proxy = Confine({"true"}, relaxed, Host(false), InvWith());
  ASSERT_TRUE(with_proxy.ok()) << with_proxy.status().message();
  Plan plan = with_proxy->plan;
  ASSERT_TRUE(plan.network.proxy.has_value());
  EXPECT_EQ(plan.network.proxy->http_port, 0);  // bound per run by the supervisor
  EXPECT_EQ(plan.network.allow, std::vector<std::string>{"github.com"});
  EXPECT_TRUE(plan.landlock.connect_tcp_ports.empty());
  for (const auto& [k, v] : plan.env.set) EXPECT_TRUE(k.find("PROXY") == std::string::npos) << k;
  // The listen() mediation and the socket filter are in the plan.
  bool listen_mediated = false;
  for (const auto& rule : plan.seccomp.rules) {
    listen_mediated |= rule.syscall == "listen" && rule.action == SeccompAction::kNotifyMediate;
  }
  EXPECT_TRUE(listen_mediated);

  AdoptProxyPorts(&plan, ProxyPorts{41001, 41002});
  EXPECT_EQ(plan.landlock.connect_tcp_ports, (std::vector<std::uint16_t>{41001, 41002}));
  auto value = [&](const std::string& k) {
    for (const auto& [name, v] : plan.env.set) {
      if (name == k) return v;
    }
    return std::string("(unset)");
  };
  EXPECT_EQ(value("HTTP_PROXY"), "http://127.0.0.1:41001");
  EXPECT_EQ(value("https_proxy"), "http://127.0.0.1:41001");
  EXPECT_EQ(value("ALL_PROXY"), "socks5h://127.0.0.1:41002");
  // 127.0.0.1 is the host's loopback here: no exemption from the proxy.
  EXPECT_EQ(value("NO_PROXY"), "(unset)");
  auto back = PlanFromJson(PlanToJson(plan));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->landlock.connect_tcp_ports, plan.landlock.connect_tcp_ports);
  EXPECT_EQ(back->network.proxy->socks_port, 41002);

  // Landlock below ABI 4 has no port rules to give.
  auto old = Confine({"true"}, relaxed, Host(false, 3), InvWith());
  ASSERT_TRUE(old.ok());
  Plan old_plan = old->plan;
  AdoptProxyPorts(&old_plan, ProxyPorts{41001, 41002});
  EXPECT_TRUE(old_plan.landlock.connect_tcp_ports.empty());
}

}  // namespace
}  // namespace agentbox

namespace agentbox {
namespace {

TEST(LandlockOnly, HomeEntriesAreLinkedIntoThePrivateHome) {
  Policy p = Partial();
  p.filesystem.read_only.push_back("~/.pyenv");
  p.filesystem.read_write = {"~/repos/x.git"};
  p.filesystem.caches = {{"npm", "~/.npm", ""}};
  p.home.import = {".gitconfig", ".pyenv/version"};
  Invocation inv = InvWith(BackendChoice::kLandlock);
  inv.cache_dir = "/home/u/.cache/agentbox";
  auto c = Confine({"true"}, p, Host(true), inv);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<std::string> links;
  for (const auto& l : c->plan.home_links) links.push_back(l.name + " -> " + l.target);
  // .pyenv/version is reached through the .pyenv link already.
  EXPECT_EQ(links, (std::vector<std::string>{".pyenv -> /home/u/.pyenv", ".npm -> /home/u/.cache/agentbox/caches/npm",
                                             ".gitconfig -> /home/u/.gitconfig", "repos/x.git -> /home/u/repos/x.git"}));
  const LandlockRule* rw = Rule(c->plan, "/home/u/repos/x.git");
  ASSERT_NE(rw, nullptr);
  EXPECT_TRUE(rw->access & LANDLOCK_ACCESS_FS_REFER);
  EXPECT_FALSE(rw->optional);
  const LandlockRule* imported = Rule(c->plan, "/home/u/.gitconfig");
  ASSERT_NE(imported, nullptr);
  EXPECT_FALSE(imported->access & LANDLOCK_ACCESS_FS_WRITE_FILE);

  // A cache outside the home has no place without a mount namespace.
  Policy outside = Partial();
  outside.filesystem.caches = {{"npm", "/npm", ""}};
  auto refused = Confine({"true"}, outside, Host(true), inv);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("filesystem.caches.npm: /npm: the landlock-only backend has no mount"),
            std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace agentbox
