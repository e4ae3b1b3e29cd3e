// Confine(): policy + host capabilities → plan + enforcement report.
//
// Pure: everything here is computed from its arguments. What depends on the
// filesystem at launch time (which read_only entries exist, which files a
// deny glob matches, whether a protected path exists) is left in the plan as
// optional or scan steps and settled by the launcher.
#include "agentbox/confine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <utility>

#include "confine/escalation.h"
#include "confine/layers.h"
#include "confine/paths.h"

namespace agentbox {
namespace {

constexpr std::uint64_t kDefaultTmpBytes = 1ull << 30;  // 1 GiB per writable tmpfs

FacetReport Facet(const char* name, bool requested) {
  FacetReport f;
  f.name = name;
  f.requested = requested;
  return f;
}

std::string SizeText(std::uint64_t bytes) { return std::to_string(bytes); }

bool Confines(const Policy& p) { return p.mode != Mode::kDangerFullAccess; }

bool NeedsProxy(const Policy& p) {
  return p.network.egress_proxy || !p.network.allow.empty() ||
         p.network.default_action == NetDefault::kAllow ||
         p.network.on_unknown_domain == UnknownDomain::kAsk;
}

// Whether the supervisor's proxy ends TLS for some host: one holds a secret,
// has L7 rules, or is a git remote credentials are scoped to.
bool Terminates(const Policy& p) {
  return !p.credentials.secrets.empty() || !p.network.http_rules.empty() ||
         !p.credentials.git_rules.remotes.empty();
}

// Where the terminator's trust bundle appears inside a mount-namespace
// sandbox (a fresh file in the new root, read-only).
constexpr const char* kCaBundlePath = "/run/agentbox/ca-bundle.pem";

// Where the supervisor's DNS listens inside the network namespace: where a
// resolver without /etc/resolv.conf looks too.
constexpr const char* kDnsAddressInside = "127.0.0.1";

// The proxy's rules, copied from the policy, and its ports.
void PlanEgress(const Policy& p, ProxyPorts ports, NetworkPlan* net) {
  net->proxy = ports;
  net->allow = p.network.allow;
  net->deny = p.network.deny;
  net->default_allow = p.network.default_action == NetDefault::kAllow;
  net->ask_unknown = p.network.on_unknown_domain == UnknownDomain::kAsk;
  net->sni_check = p.network.tls_sni_check;
  net->sni_ports = p.network.tls_sni_ports;
  net->inspect_tls_all = p.network.inspect_tls_all;
  net->inspect_tls = p.network.inspect_tls;
  net->terminate = Terminates(p);
  if (net->terminate) {
    net->credentials = p.credentials;
    net->http_rules = p.network.http_rules;
  }
}

std::string UsernsWhy(const HostCaps& host) {
  return "user namespaces unavailable" + (host.userns_reason.empty() ? std::string() : ": " + host.userns_reason);
}

// "6.1.0-18-amd64" is at least 6.1; an unreadable release is not.
bool KernelAtLeast(const std::string& release, int major, int minor) {
  int ma = 0, mi = 0;
  if (std::sscanf(release.c_str(), "%d.%d", &ma, &mi) != 2) return false;
  return ma > major || (ma == major && mi >= minor);
}

// max_processes where no pids cgroup is ours: RLIMIT_NPROC set by the runner
// inside the sandbox's own user namespace. Since Linux 5.14 the kernel keeps
// the count per user namespace and uid (ucounts), so inside a fresh one it
// counts the sandbox's tasks alone. Why it cannot bound them, or "".
std::string NprocInUsernsUnavailable(const HostCaps& host, bool userns_backend) {
  if (!userns_backend) {
    return "no user namespace of its own (RLIMIT_NPROC would count every process of uid " +
           std::to_string(host.uid) + " on the host, not the sandbox's)";
  }
  if (host.uid == 0) return "RLIMIT_NPROC does not bind uid 0 (the kernel exempts the root user)";
  if (!KernelAtLeast(host.kernel_release, 5, 14)) {
    return "Linux " + host.kernel_release + " counts RLIMIT_NPROC per user, not per user namespace (5.14+)";
  }
  return "";
}

// Why the namespaces backend cannot run on this host, or "" when it can.
std::string NamespacesLack(const HostCaps& host) {
  if (!host.user_namespaces) return UsernsWhy(host);
  // The deep probe's real mount wins over what mountinfo suggests.
  const bool proc_refused = host.proc_mount_errno > 0 || (host.proc_mount_errno < 0 && !host.proc_fully_visible);
  if (!proc_refused) return "";
  std::string hidden;
  for (const auto& p : host.proc_overmounts) hidden += (hidden.empty() ? "" : ", ") + p;
  return "a fresh /proc cannot be mounted in a user namespace here: the host's /proc is not fully visible" +
         (hidden.empty() ? std::string() : " (mounted over: " + hidden + ")");
}

// on_violation for the supervisor: the ceiling with `~` expanded, and
// what no grant reaches. The workspace target must be final.
void PlanEscalation(const Policy& policy, const Invocation& inv, Plan* plan) {
  if (policy.on_violation.escalation != Escalation::kOneTimeApproval) return;
  EscalationPlan& e = plan->escalation;
  const MaxGrantSpec& g = policy.on_violation.max_grant;
  e.offers = true;
  e.network = g.network;
  e.syscalls = g.syscalls;
  e.memory_max_bytes = g.memory_bytes;
  for (const auto& [from, to] : {std::pair{&g.filesystem_read, &e.filesystem_read},
                                 std::pair{&g.filesystem_write, &e.filesystem_write}}) {
    for (const auto& entry : *from) {
      std::string p = paths::ExpandHome(entry, inv.home);
      if (!p.empty()) to->push_back(p);  // `~` with no home: nothing it could name
    }
  }
  for (const auto* list : {&policy.filesystem.deny, &NeverGrantedPaths()}) {
    for (const auto& entry : *list) {
      std::string p = paths::ExpandHome(entry, inv.home);
      if (!p.empty() && std::find(e.never.begin(), e.never.end(), p) == e.never.end()) e.never.push_back(p);
    }
  }
  for (const auto& d : inv.own_dirs) e.never.push_back(d);
  for (const auto& entry : policy.filesystem.protect) {
    std::string p = entry[0] == '/' ? entry : paths::Join(plan->workspace_target, entry);
    if (!inv.workspace.empty() && paths::IsWithin(p, inv.workspace) && inv.workspace != plan->workspace_target) {
      p = paths::Rebase(p, inv.workspace, plan->workspace_target);  // given as a host path
    }
    e.protect.push_back(p);
  }
}

// The empty directories on the root tmpfs for the ceiling trees (see the
// namespaces backend's plan); `mounts` is the mount list so far, whose
// trees need nothing. A tree both read and written is planned writable.
void PlanCeilingDirs(const Policy& policy, const Invocation& inv, std::vector<MountOp>* mounts) {
  const MaxGrantSpec& g = policy.on_violation.max_grant;
  auto inside_mounted = [&](const std::string& p) {
    return std::any_of(mounts->begin(), mounts->end(), [&](const MountOp& m) {
      switch (m.kind) {
        case MountKind::kTmpfs:
          return m.target != "/" && paths::IsWithin(p, m.target);
        case MountKind::kBind:
        case MountKind::kOverlay:
          return paths::IsWithin(p, m.target) || paths::IsWithin(p, m.source);
        case MountKind::kDir:  // another ceiling's directory: planned once, writable wins below
          return false;
        default:  // devices, procfs, devpts, files, links: nothing to graft into
          return paths::IsWithin(p, m.target);
      }
    });
  };
  for (const auto& [list, writable] : {std::pair{&g.filesystem_write, true}, std::pair{&g.filesystem_read, false}}) {
    for (const auto& entry : *list) {
      const std::string p = paths::ExpandHome(entry, inv.home);
      if (p.empty() || p == "/" || inside_mounted(p)) continue;
      auto same = std::find_if(mounts->begin(), mounts->end(),
                               [&](const MountOp& m) { return m.kind == MountKind::kDir && m.target == p; });
      if (same != mounts->end()) continue;  // the writable entry came first
      mounts->push_back({MountKind::kDir, "", p, !writable, false, "",
                         std::string("on_violation.max_grant.") + (writable ? "filesystem_write: " : "filesystem_read: ") +
                             entry + " (grants are mounted below it)"});
    }
  }
}

bool Writable(const Policy& p) {
  return p.mode == Mode::kWorkspaceWrite && p.filesystem.workspace.access == Access::kReadWrite;
}

// What the landlock-only backend can and cannot fence of the deny and
// protect entries. Landlock rules only add access: a path beneath a granted
// tree (a read_only entry, the workspace) cannot be taken away again, so a
// deny entry that overlaps one stays readable, and a protect entry inside a
// writable workspace stays writable. Deny entries outside every granted tree
// are denied by construction (EACCES): `absent`.
struct LandlockOnlyFences {
  std::vector<MissingFacet> gaps;   // deny entries: facet credentials; protect entries: facet filesystem
  std::vector<std::string> absent;  // host paths
};

LandlockOnlyFences FenceLandlockOnly(const Policy& policy, const Invocation& inv) {
  std::vector<std::pair<std::string, const char*>> trees;  // host path, its list
  for (const auto& [list, name] : {std::pair{&policy.filesystem.read_only, "read_only"},
                                   std::pair{&policy.filesystem.read_write, "read_write"}}) {
    for (const auto& entry : *list) {
      std::string p = paths::ExpandHome(entry, inv.home);
      if (!p.empty()) trees.emplace_back(p, name);
    }
  }
  LandlockOnlyFences out;
  for (const auto& entry : policy.filesystem.deny) {
    std::string p = paths::ExpandHome(entry, inv.home);
    if (p.empty()) continue;  // `~` with no HOME to expand against: nothing it could name
    std::string tree;
    if (p[0] != '/') {
      // Relative entries lie in the workspace by definition, known or not.
      tree = inv.workspace.empty() ? "the workspace" : "the workspace " + inv.workspace;
      if (!inv.workspace.empty()) p = paths::Join(inv.workspace, p);
    } else {
      const std::string root =
          paths::HasGlob(p) ? paths::Parent(p.substr(0, p.find_first_of("*?[") + 1)) : p;
      auto it = std::find_if(trees.begin(), trees.end(), [&](const auto& t) {
        return paths::IsWithin(root, t.first) || paths::IsWithin(t.first, root);
      });
      auto overlaps = [&](const std::string& t) { return paths::IsWithin(root, t) || paths::IsWithin(t, root); };
      if (it != trees.end()) {
        tree = std::string("the ") + it->second + " entry " + it->first;
      } else if (!inv.workspace.empty() && overlaps(inv.workspace)) {
        tree = "the workspace " + inv.workspace;
      }
    }
    if (tree.empty()) {
      out.absent.push_back(p);
      continue;
    }
    const std::string named = p == entry ? "'" + entry + "'" : "'" + entry + "' (" + p + ")";
    out.gaps.push_back({"credentials", "filesystem.deny " + named + " is not fenced: it lies in " +
                                           tree + ", which Landlock grants, and Landlock rules only add "
                                           "access, so what it names stays readable (file permissions alone "
                                           "guard it; the namespaces backend masks it)"});
  }
  for (const auto& entry : policy.filesystem.protect) {
    if (entry[0] != '/') continue;
    for (const auto& rw : policy.filesystem.read_write) {
      std::string tree = paths::ExpandHome(rw, inv.home);
      if (tree.empty() || !paths::IsWithin(entry, tree)) continue;
      out.gaps.push_back({"filesystem", "filesystem.protect '" + entry + "' stays writable: it lies in "
                                            "filesystem.read_write '" + rw + "', which Landlock grants "
                                            "read-write, and Landlock rules only add access"});
      break;
    }
  }
  if (Writable(policy)) {
    for (const auto& entry : policy.filesystem.protect) {
      std::string p = entry[0] == '/' ? entry : paths::Join(inv.workspace, entry);
      if (!inv.workspace.empty() && !paths::IsWithin(p, inv.workspace)) continue;  // outside: not granted writable
      out.gaps.push_back({"filesystem", "filesystem.protect '" + entry +
                                            "' stays writable: the workspace is granted read-write and "
                                            "Landlock rules only add access"});
    }
  }
  return out;
}

// The network facet of the landlock-only backend: the host's network,
// fenced by Landlock's TCP rules (ABI 4: connect and bind refused but on
// the proxy's ports), the seccomp socket filter (no UDP, ICMP, raw or other
// protocols; listen() mediated) and the runner's connect() mediation (inet:
// 127.0.0.1 on the proxy's ports only). The seccomp filter is certain here:
// SelectBackend offers the backend only with it.
void AssessHostNetwork(const Policy& policy, int ll_abi, const std::string& why_no_ns, FacetReport* net,
                       EnforcementReport* r) {
  const bool proxy = NeedsProxy(policy);
  if (ll_abi >= 4) net->mechanisms.push_back("landlock-net-tcp");
  net->mechanisms.push_back("seccomp-socket-filter");
  net->mechanisms.push_back("connect-mediation");
  if (proxy) net->mechanisms.push_back("egress-proxy");
  net->level = Level::kFull;
  net->notes.push_back(
      proxy ? "egress through the supervisor's proxy on the host's 127.0.0.1 (two ephemeral ports per run, in "
              "HTTP_PROXY/HTTPS_PROXY/ALL_PROXY), or directly: every other TCP connect() is decided by the "
              "supervisor by network.allow / deny (IP and CIDR entries: no DNS is served without a network "
              "namespace, so names are the proxy's), refused ones reported; bind is refused, UDP, ICMP, raw and "
              "other sockets are not made"
            : "no egress: every TCP connect and bind is refused (and reported), UDP, ICMP, raw and other sockets "
              "are not made");
  net->notes.push_back(why_no_ns + ": the host's interfaces, addresses and routes stay visible (/proc/net, "
                                   "getifaddrs), and nothing in the sandbox can listen on a TCP port");
  if (proxy) {
    net->notes.push_back("the proxy's ports are on the host's loopback, where any local process can connect: it "
                         "serves only connections whose client socket a process of the sandbox holds (sock_diag, "
                         "/proc) and closes any other");
  }
  if (ll_abi < 4) {
    r->missing.push_back({"network", why_no_ns + ": Landlock ABI " + std::to_string(ll_abi) +
                                         " < 4 cannot restrict TCP: TCP rests on the seccomp connect() mediation "
                                         "alone, with no second fence"});
  }
  if (ll_abi < 6) {
    r->missing.push_back({"network", why_no_ns + ": abstract unix sockets of host services are reachable "
                                                 "(Landlock scopes them from ABI 6; this kernel has ABI " +
                                         std::to_string(ll_abi) + ")"});
  } else {
    net->notes.push_back("abstract unix sockets outside the sandbox are scoped off by Landlock (ABI 6)");
  }
}

// disk_gib and the host workspace a run writes to. A session writes into
// its own layer (sessions bound that), a read-only workspace cannot fill;
// otherwise the workspace is bounded by the run's overlay, by a project
// quota, or not at all, which is missing.
template <typename Missing>
void AssessWorkspaceDisk(const Policy& policy, const Invocation& inv, bool landlock_only, FacetReport* rf,
                         Missing& missing) {
  if (inv.session || !Writable(policy)) return;
  if (inv.workspace_overlay && !landlock_only) {
    rf->mechanisms.push_back("workspace-overlay");
    rf->notes.push_back("disk_gib: the run writes into an upper layer on a tmpfs of that size over the workspace "
                        "(--workspace-overlay); its changes are applied to the workspace at the end (--apply " +
                        std::string(ToString(*inv.workspace_overlay)) + ")");
    return;
  }
  if (inv.workspace_fs.project_quota) {
    rf->mechanisms.push_back("project-quota");
    rf->notes.push_back("disk_gib: the workspace " + inv.workspace + " (" + inv.workspace_fs.fstype +
                        ") gets a project quota of its current use plus disk_gib for the run: what the run "
                        "writes there beyond disk_gib fails with EDQUOT");
    return;
  }
  const std::string where = inv.workspace.empty() ? "the workspace" : "the workspace " + inv.workspace;
  const std::string fact = !inv.workspace_fs.known ? "is not known here (settled per run)"
                           : inv.workspace_fs.why_not.empty()
                               ? "is on " + inv.workspace_fs.fstype + " without project quotas"
                               : "is on " + inv.workspace_fs.fstype + " " + inv.workspace_fs.why_not;
  missing(*rf, "disk_gib: " + where + " " + fact + ": total disk use in it is not limited" +
                   (landlock_only ? " (--workspace-overlay needs the namespaces backend)"
                                  : "; --workspace-overlay bounds it"));
}

// The mechanisms of the facet `name` (none when absent).
const std::vector<std::string>& FindFacet(const EnforcementReport& r, const char* name) {
  static const std::vector<std::string> kNone;
  for (const auto& f : r.facets) {
    if (f.name == name) return f.mechanisms;
  }
  return kNone;
}

// Each facet's level from what is missing: a facet with an entry in
// `missing` is partial (none without any mechanism), never full; the whole
// report is full only when nothing is missing.
void SettleLevels(EnforcementReport* r) {
  for (auto& f : r->facets) {
    const bool short_of = std::any_of(r->missing.begin(), r->missing.end(),
                                      [&](const MissingFacet& m) { return m.facet == f.name; });
    if (short_of && f.level == Level::kFull) f.level = f.mechanisms.empty() ? Level::kNone : Level::kPartial;
  }
  r->level = r->missing.empty() ? Level::kFull : Level::kPartial;
}

// sandbox.isolation: container on this host and for this invocation: what
// gVisor cannot be given here, or "" when it can.
std::string ContainerLack(const Policy& policy, const HostCaps& host, const Invocation& inv) {
  const LadderCaps& l = host.ladder;
  if (!l.probed) return "gVisor's runsc was not looked for (the host probe did not include the isolation ladder)";
  if (!l.runsc_why.empty()) return l.runsc_why;
  if (l.runsc.empty()) return "gVisor's runsc was not found";
  if (inv.workspace_overlay) return "--workspace-overlay is not available on gVisor in this version";
  if (NeedsProxy(policy) && Terminates(policy)) {
    return "credentials and network.http_rules end TLS in agentbox's proxy with a CA of the run's, which a gVisor "
           "sandbox is not given in this version (egress by network.allow is)";
  }
  // (A session's sandbox has no network: its egress is carried on its
  // stream to the host's proxy, with or without root.)
  if (NeedsProxy(policy) && l.runsc_rootless && !inv.session) {
    return "the policy lets the sandbox reach the network (network.allow or egress_proxy): egress from gVisor goes "
           "through a network namespace agentbox prepares with the proxy's listeners, which runsc --rootless "
           "cannot join (it is this user's, not root's); without root, no egress on gVisor in this version";
  }
  if (!policy.filesystem.unix_sockets.empty()) {
    return "filesystem.unix_sockets: a gVisor sandbox reaches no host socket in this version";
  }
  return "";
}

// The report of a run on gVisor: the command's syscalls are served by the
// Sentry (a kernel in user space), which reaches host files only through
// the mounts of the plan (by its gofer). The resources facet is the
// namespaces backend's: the same cgroup, with runsc's processes in it.
EnforcementReport AssessGvisor(const Policy& policy, const HostCaps& host, const Invocation& inv) {
  Policy os = policy;
  os.sandbox.isolation = Isolation::kOs;
  // max_processes is the Sentry's to count (below): a host pids cgroup
  // would count the Sentry's own threads and stub processes instead.
  os.resources.max_processes.reset();
  Invocation ns = inv;
  ns.backend = BackendChoice::kAuto;
  const EnforcementReport host_report = AssessEnforcement(os, host, ns);
  EnforcementReport r;
  r.backend = ToString(Backend::kGvisor);
  const LadderCaps& l = host.ladder;
  r.runtime = "runsc " + (l.runsc_version.empty() ? std::string("(version unknown)") : l.runsc_version) +
              " (platform " + l.runsc_platform + (l.runsc_rootless ? ", rootless" : "") + ")";
  const std::string lack = ContainerLack(policy, host, inv);
  r.backend_reason = lack.empty() ? "sandbox.isolation: container (gVisor at " + l.runsc + ")" : lack;

  FacetReport fs = Facet("filesystem", true);
  fs.mechanisms = {"gvisor-sentry", "gvisor-gofer", "oci-mounts", "read-only-binds", "mask-binds"};
  fs.level = Level::kFull;
  fs.notes.push_back("the command's file syscalls are served by gVisor's Sentry, a kernel in user space; host "
                     "files reach it only through the plan's mounts, opened by runsc's gofer");
  fs.notes.push_back("no Landlock layer inside: gVisor does not implement Landlock, so the mount plan is the fence, "
                     "and the host kernel is not the one the command talks to");
  fs.notes.push_back("workspace is a host bind: what the run writes there lands on the host at once");
  r.facets.push_back(fs);

  FacetReport net = Facet("network", true);
  net.level = Level::kFull;
  if (NeedsProxy(policy)) {
    net.mechanisms = {"gvisor-hostinet-private-netns", "egress-proxy"};
    net.notes.push_back("the sandbox's sockets are this host kernel's (runsc --network=host), in a network namespace "
                        "of the run's own with a loopback only, where the proxy's listeners are all there is to "
                        "reach: every connection out goes through agentbox's proxy and network.allow");
    net.notes.push_back("the host kernel's TCP/IP stack, not gVisor's netstack, serves those sockets: more host "
                        "kernel is exposed than with no network");
  } else {
    net.mechanisms = {"gvisor-network-none"};
    net.notes.push_back("the sandbox has a loopback device only (runsc --network=none): no route out, no host socket");
  }
  r.facets.push_back(net);

  FacetReport proc = Facet("processes", true);
  proc.mechanisms = {"gvisor-sentry-pid-namespace", "gvisor-sentry-ipc-namespace", "gvisor-sentry-uts-namespace",
                     "host-pid-namespace-of-runsc"};
  proc.level = Level::kFull;
  proc.notes.push_back("processes, signals, System V IPC and the hostname are the Sentry's: no host process is visible "
                       "or signalable from inside");
  r.facets.push_back(proc);

  FacetReport sys = Facet("syscalls", true);
  sys.mechanisms = {"gvisor-sentry", "runsc-host-seccomp"};
  sys.level = Level::kFull;
  if (host.seccomp_filter) {
    sys.mechanisms.push_back("oci-seccomp");
    sys.notes.push_back("the plan's seccomp denials, as the OCI spec's filter loaded inside the Sentry (runsc "
                        "--oci-seccomp): a second fence in front of gVisor's own syscall table");
  }
  sys.notes.push_back("the Sentry implements the syscalls itself and asks the host kernel for a small set only, "
                      "under runsc's own seccomp filter (platform " + l.runsc_platform + ")");
  r.facets.push_back(sys);

  for (const auto& f : host_report.facets) {
    if (f.name != "filesystem" && f.name != "network" && f.name != "processes" && f.name != "syscalls") {
      r.facets.push_back(f);
      if (f.name == "resources" && policy.resources.max_processes) {
        r.facets.back().requested = true;
        r.facets.back().mechanisms.push_back("gvisor-rlimit-nproc");
        r.facets.back().notes.push_back(
            "max_processes: RLIMIT_NPROC " + std::to_string(*policy.resources.max_processes) +
            " in the OCI spec, counted by gVisor's Sentry over the sandbox's own processes and threads; a fork "
            "past it fails with EAGAIN (a host pids cgroup would count the Sentry's threads instead)");
      }
    }
  }
  for (const auto& m : host_report.missing) {
    if (m.facet != "filesystem" && m.facet != "network" && m.facet != "processes" && m.facet != "syscalls") {
      r.missing.push_back(m);
    }
  }
  r.skipped = host_report.skipped;
  r.notes = host_report.notes;
  if (!lack.empty()) r.missing.push_back({"filesystem", "sandbox.isolation: container: " + lack});
  SettleLevels(&r);
  return r;
}

// sandbox.isolation: microvm on this host and for this invocation: what a
// microVM cannot be given here, or "" when it can.
std::string MicrovmLack(const Policy& policy, const HostCaps& host, const Invocation& inv) {
  const LadderCaps& l = host.ladder;
  if (!l.probed) return "QEMU was not looked for (the host probe did not include the isolation ladder)";
  if (!l.microvm_why.empty()) return l.microvm_why;
  if (l.qemu.empty()) return "QEMU is not installed (Debian package qemu-system-x86)";
  if (l.virtiofsd.empty()) return "QEMU's virtiofsd is not installed (Debian package qemu-system-common)";
  if (l.guest_image.empty() || l.guest_kernel.empty()) return "no guest kernel with agentbox's guest image";
  if (inv.workspace_overlay) return "--workspace-overlay is not available on a microVM in this version";
  if (!policy.filesystem.unix_sockets.empty()) {
    return "filesystem.unix_sockets: a microVM reaches no host socket in this version";
  }
  // Measured: the guest kernel and the 15 MB init do not boot in 80 MiB, and do in 96.
  constexpr std::uint64_t kMinGuestBytes = 96ull << 20;
  if (policy.resources.memory_limit_bytes && *policy.resources.memory_limit_bytes < kMinGuestBytes) {
    return "resources.memory_gib.limit of " + std::to_string(*policy.resources.memory_limit_bytes >> 20) +
           " MiB is the VM's memory, below the 96 MiB its guest kernel and init need to boot";
  }
  return "";
}

// The report of a run in a microVM: the command talks to a guest kernel of
// its own; the guest's init applies the namespaces plan again inside (mount
// namespace, Landlock and seccomp of the guest kernel), and what the guest
// can reach of the host is what the virtiofs shares export, each prepared
// on the host side with the plan's masks.
EnforcementReport AssessMicrovm(const Policy& policy, const HostCaps& host, const Invocation& inv) {
  Policy os = policy;
  os.sandbox.isolation = Isolation::kOs;
  Invocation ns = inv;
  ns.backend = BackendChoice::kAuto;
  const EnforcementReport host_report = AssessEnforcement(os, host, ns);
  EnforcementReport r;
  r.backend = ToString(Backend::kMicrovm);
  const LadderCaps& l = host.ladder;
  r.runtime = "qemu microvm (accelerator " + l.accel() + "), guest kernel " +
              (l.guest_kernel.empty() ? std::string("(none)") : l.guest_kernel.substr(l.guest_kernel.rfind('/') + 1));
  const std::string lack = MicrovmLack(policy, host, inv);
  r.backend_reason = lack.empty() ? "sandbox.isolation: microvm (QEMU at " + l.qemu + ", " +
                                        (l.kvm ? std::string("KVM") : "TCG: " + l.kvm_why) + ")"
                                  : lack;
  for (const auto& f : host_report.facets) {
    FacetReport g = f;
    if (f.name == "filesystem") {
      g.mechanisms.insert(g.mechanisms.begin(), {"guest-kernel", "virtiofs-shares", "host-side-masks"});
      g.notes.insert(g.notes.begin(),
                     "the command's file syscalls are the guest kernel's; host files reach the guest only through "
                     "virtiofs shares of the plan's trees, each exported by a virtiofsd whose own view has the "
                     "plan's masks bound over (so not even a compromised guest kernel reads a masked path)");
      g.notes.push_back("inside the guest the plan is applied again: mount namespace, masks and the guest kernel's "
                        "Landlock");
    } else if (f.name == "network") {
      g.mechanisms = {"no-network-device"};
      g.notes = {"the VM has no network device (QEMU -nodefaults, no -netdev): no route out, no host socket"};
      if (NeedsProxy(policy)) {
        g.mechanisms.push_back("egress-proxy-over-channel");
        g.notes.push_back("egress: the guest's init listens on the proxy variables' ports of the guest's loopback "
                          "and carries each connection over the VM's virtio-serial port to agentbox's proxy on "
                          "this host, which decides it by network.allow and network.deny");
        if (Terminates(policy)) {
          g.notes.push_back("credentials and network.http_rules: that proxy ends TLS with a CA of the run's; the "
                            "guest gets the CA's certificate in its trust bundle and placeholders, never the key or "
                            "a secret");
        }
      } else {
        g.mechanisms.push_back("guest-network-namespace");
      }
    } else if (f.name == "processes") {
      g.mechanisms.insert(g.mechanisms.begin(), "guest-kernel");
      g.notes.insert(g.notes.begin(), "the command's processes live in the guest kernel: no host process is "
                                      "visible or signalable from inside");
    } else if (f.name == "syscalls") {
      g.mechanisms.insert(g.mechanisms.begin(), "guest-kernel");
      g.notes.insert(g.notes.begin(), "the plan's seccomp filter is loaded by the guest kernel; a syscall that "
                                      "passes it reaches the guest kernel, not this host's");
    } else if (f.name == "resources") {
      g.mechanisms.clear();
      g.notes.clear();
      g.mechanisms.push_back("vm-memory");
      g.mechanisms.push_back("vm-vcpus");
      g.notes.push_back("memory_gib.limit is the VM's RAM (the guest kernel and init live in it too); the guest "
                        "kernel's OOM killer ends what does not fit, counted from its vmstat");
      g.notes.push_back("cpu.limit is the VM's vCPU count, rounded up to a whole CPU");
      if (policy.resources.max_processes) {
        g.mechanisms.push_back("guest-pids-cgroup");
        g.notes.push_back("max_processes: pids.max " + std::to_string(*policy.resources.max_processes) +
                          " on a cgroup of the guest kernel's, which the command starts in");
      }
      if (policy.resources.wall_clock_ms) g.mechanisms.push_back("wall-clock-vm-kill");
      g.level = Level::kFull;
    }
    r.facets.push_back(g);
  }
  for (const auto& m : host_report.missing) {
    // The host's cgroups are not what limits the VM.
    if (m.facet != "resources") r.missing.push_back(m);
  }
  r.skipped = host_report.skipped;
  r.notes = host_report.notes;
  if (!lack.empty()) r.missing.push_back({"filesystem", "sandbox.isolation: microvm: " + lack});
  SettleLevels(&r);
  return r;
}

}  // namespace

Status CheckAvailable(const Policy& policy) {
  const Isolation iso = policy.sandbox.isolation;
  if (policy.mode == Mode::kDangerFullAccess) return {};
  if (iso == Isolation::kHost) {
    return Status::Error("confine",
                         "sandbox.isolation: host means no isolation; ask for it by name with "
                         "mode danger-full-access");
  }
  if (iso == Isolation::kRemote) {
    return Status::Error("confine", "sandbox.isolation: remote runs a session's world on another host (a session "
                                    "of agentbox serve or agentbox mcp); a command run here is confined here: use "
                                    "isolation os, container or microvm for it; refusing rather than downgrading");
  }
  if (iso != Isolation::kOs && iso != Isolation::kContainer && iso != Isolation::kMicrovm) {
    return Status::Error("confine", std::string("sandbox.isolation: ") + ToString(iso) +
                                        " is not available in this version (available: os, container, microvm); "
                                        "refusing rather than downgrading");
  }
  if (policy.sandbox.image != "host") {
    return Status::Error("confine", "sandbox.image: '" + policy.sandbox.image +
                                        "' is not available (only 'host' is: no image store in "
                                        "this version)");
  }
  return {};
}

Result<BackendSelection> SelectBackend(const HostCaps& host, BackendChoice choice) {
  const bool landlock_ok = host.landlock_abi >= kMinLandlockAbi && host.seccomp_filter;
  const std::string landlock_lack =
      host.landlock_abi < kMinLandlockAbi
          ? "Landlock ABI " + std::to_string(host.landlock_abi) + " (needs >= " +
                std::to_string(kMinLandlockAbi) + ")"
          : "no seccomp filtering";
  switch (choice) {
    case BackendChoice::kNamespaces:
      if (const std::string lack = NamespacesLack(host); !lack.empty()) {
        return Status::Error("confine", "--backend namespaces: " + lack + "; refusing rather than downgrading");
      }
      return BackendSelection{Backend::kNamespaces, "forced by --backend namespaces"};
    case BackendChoice::kLandlock:
      if (!landlock_ok) {
        return Status::Error("confine", "--backend landlock: " + landlock_lack + " on this host");
      }
      return BackendSelection{Backend::kLandlockOnly, "forced by --backend landlock"};
    case BackendChoice::kAuto:
      break;
  }
  const std::string ns_lack = NamespacesLack(host);
  if (ns_lack.empty()) return BackendSelection{Backend::kNamespaces, "user namespaces available"};
  if (landlock_ok) return BackendSelection{Backend::kLandlockOnly, ns_lack};
  return Status::Error("confine", "no sandbox backend on this host: " + ns_lack + ", and " +
                                      landlock_lack + " for the landlock-only backend");
}

EnforcementReport AssessEnforcement(const Policy& policy, const HostCaps& host, BackendChoice choice, bool session) {
  Invocation inv;
  inv.backend = choice;
  inv.session = session;
  return AssessEnforcement(policy, host, inv);
}

EnforcementReport AssessEnforcement(const Policy& policy, const HostCaps& host, const Invocation& inv) {
  if (Confines(policy) && policy.sandbox.isolation == Isolation::kContainer) return AssessGvisor(policy, host, inv);
  if (Confines(policy) && policy.sandbox.isolation == Isolation::kMicrovm) return AssessMicrovm(policy, host, inv);
  const BackendChoice choice = inv.backend;
  const bool session = inv.session;
  EnforcementReport r;
  if (!Confines(policy)) {
    r.level = Level::kNone;
    r.backend = "none";
    for (const char* name : {"filesystem", "network", "processes", "syscalls", "resources"}) {
      FacetReport f = Facet(name, false);
      f.level = Level::kNone;
      f.notes.push_back("danger-full-access: not confined");
      if (f.name == "resources" && policy.resources.wall_clock_ms) {
        f.requested = true;
        f.level = Level::kFull;
        f.mechanisms.push_back("supervisor-deadline");
        f.notes.back() += "; the wall clock still applies";
      }
      r.facets.push_back(f);
    }
    return r;
  }
  // No usable backend: the namespaces assessment, which says what is missing.
  auto selected = SelectBackend(host, choice);
  const bool landlock_only = selected.ok() && selected->backend == Backend::kLandlockOnly;
  r.backend = ToString(landlock_only ? Backend::kLandlockOnly : Backend::kNamespaces);
  if (selected.ok()) r.backend_reason = selected->why;
  const bool userns = NamespacesLack(host).empty() && !landlock_only;
  auto missing = [&r](FacetReport& f, const std::string& reason) {
    f.level = f.mechanisms.empty() ? Level::kNone : Level::kPartial;
    r.missing.push_back({f.name, reason});
  };
  const int ll_abi = std::min(host.landlock_abi, kNewestLandlockAbi);
  const std::string why_no_ns = "no namespaces (" + (selected.ok() ? selected->why : NamespacesLack(host)) + ")";

  // Filesystem: a fresh root with only what the policy names.
  FacetReport fs = Facet("filesystem", true);
  if (landlock_only) {
    // Which deny/protect entries are affected depends on the invocation:
    // Confine() adds them, each by name.
    fs.mechanisms = {"landlock-abi-" + std::to_string(ll_abi), "host-paths"};
    fs.notes.push_back("Landlock allows only the read_only entries, the workspace, a private per-run "
                       "directory, a few /dev nodes and reading /proc; everything else is denied (EACCES)");
    missing(fs, why_no_ns + ": no mount namespace: no private /tmp (a private directory via TMPDIR and HOME "
                            "instead), and deny entries inside allowed trees cannot be masked nor protect "
                            "entries inside a writable workspace made read-only (Landlock rules only add access)");
  } else if (userns && host.mount_ns) {
    fs.mechanisms = {"user-namespace", "mount-namespace", "pivot_root", "read-only-binds",
                     "mask-binds"};
    fs.level = Level::kFull;
    if (!host.new_mount_api) {
      fs.mechanisms.clear();
      missing(fs, "kernel lacks open_tree/move_mount/mount_setattr (needs Linux >= 5.12)");
    }
    fs.notes.push_back(inv.workspace_overlay
                           ? "workspace is an overlay over a host bind: the run's changes are applied at its end"
                           : "workspace is a host bind: what the run writes there lands on the host at once");
    // Landlock: a second, independent fence around the same mount plan.
    if (host.landlock_abi >= kMinLandlockAbi) {
      const int abi = std::min(host.landlock_abi, kNewestLandlockAbi);
      fs.mechanisms.push_back("landlock-abi-" + std::to_string(abi));
      std::string note = "Landlock ABI " + std::to_string(abi) + " allows only what the mount plan mounts";
      auto left_out = LandlockLeftOut(abi);
      if (left_out.empty()) {
        note += "; a lower ABI would leave out:";
        for (const auto& l : LandlockLeftOut(kMinLandlockAbi)) note += " " + l + ";";
        note.pop_back();
      } else {
        note += "; this ABI leaves out:";
        for (const auto& l : left_out) note += " " + l + ";";
        note.pop_back();
      }
      fs.notes.push_back(note);
    } else if (fs.level == Level::kFull) {
      missing(fs, host.landlock_abi == 0
                      ? "Landlock unavailable (kernel < 5.13, or not in the lsm= list): the filesystem "
                        "rests on the mount namespace alone"
                      : "Landlock ABI " + std::to_string(host.landlock_abi) +
                            " lacks the refer right (ABI 2): the layer is not applied and the filesystem "
                            "rests on the mount namespace alone");
    }
  } else {
    missing(fs, "no namespaces: " + NamespacesLack(host));
  }
  // Pathname unix sockets: a same-uid service behind one (a session bus, an
  // ssh agent, agentbox's daemon) acts outside every fence. Neither mounts
  // nor Landlock fence connect(); the seccomp filter hands each to the runner.
  if (host.seccomp_filter) {
    fs.mechanisms.push_back("seccomp-unix-connect");
  } else {
    missing(fs, "no seccomp filter: connect() to pathname unix sockets the sandbox can see (host services "
                "of this uid) is not fenced");
  }
  r.facets.push_back(fs);

  // Network: only loopback, unless the policy needs the egress proxy.
  FacetReport net = Facet("network", true);
  if (landlock_only) {
    AssessHostNetwork(policy, ll_abi, why_no_ns, &net, &r);
  } else if (userns && host.net_ns) {
    net.mechanisms = {"network-namespace"};
    net.level = Level::kFull;
    if (host.seccomp_filter) {
      net.mechanisms.push_back("connect-broker");
      net.mechanisms.push_back("dns-inside");
      net.notes.push_back(
          "DNS inside is the supervisor's, at 127.0.0.1:53 (UDP and TCP): a name network.allow admits gets its "
          "real addresses, any other is refused (REFUSED) and reported; every TCP connect() past the sandbox's "
          "own loopback is decided by the supervisor, which opens an allowed connection from the host and "
          "installs it in place of the caller's socket; UDP leaves only as DNS");
      net.notes.push_back(
          "a connection installed directly carries no relay and so no TLS SNI check: a client may name another "
          "tenant of an allowed address in its TLS handshake (domain fronting); network.inspect_tls keeps the "
          "relay and the check for the hosts it names, and hosts with credentials or network.http_rules always "
          "go through the terminator");
    }
    if (NeedsProxy(policy)) {
      net.mechanisms.push_back("egress-proxy");
      net.notes.push_back("no route out; egress only through the supervisor's proxy at 127.0.0.1:3128 (HTTP) "
                          "and 127.0.0.1:1080 (SOCKS5), deciding each connection by network.allow / deny");
    } else {
      net.notes.push_back("loopback only; no route out");
    }
  } else {
    missing(net, "no network namespace: " + NamespacesLack(host));
  }
  r.facets.push_back(net);

  // Processes: own pid namespace with the runner as init.
  FacetReport proc = Facet("processes", true);
  if (landlock_only) {
    proc.mechanisms = {"setsid", "child-subreaper", "descendants-killed-at-exit"};
    if (ll_abi >= 6) proc.mechanisms.push_back("landlock-scope-signals");
    if (host.seccomp_filter) proc.mechanisms.push_back("seccomp-ptrace-denied");
    proc.notes.push_back("what the command leaves running is killed at the end: the runner is a child "
                         "subreaper, so every descendant stays below it and a /proc walk finds them; a "
                         "process started for it by a host service (over a unix socket) is not a descendant");
    missing(proc, why_no_ns + ": no pid namespace: host processes are visible in /proc; " +
                      std::string(ll_abi >= 6 ? "signals to them are refused by Landlock scoping (ABI 6)"
                                              : "signals to the user's own processes are not refused "
                                                "(Landlock ABI < 6)") +
                      ", ptrace by seccomp and Landlock; no ipc or uts namespace: System V IPC and the "
                      "hostname are the host's");
  } else if (userns && host.pid_ns) {
    proc.mechanisms = {"pid-namespace", "ipc-namespace", "uts-namespace"};
    if (host.cgroup_ns) proc.mechanisms.push_back("cgroup-namespace");
    proc.mechanisms.push_back("runner-as-init");
    proc.level = Level::kFull;
    if (host.sethostname_errno > 0) {
      proc.notes.push_back("the hostname stays the container's: sethostname in the sandbox's own uts namespace "
                           "is refused (" + std::string(strerror(host.sethostname_errno)) +
                           ") by the seccomp filter agentbox runs under");
    }
  } else {
    missing(proc, "no pid namespace: " + NamespacesLack(host));
  }
  r.facets.push_back(proc);

  // Syscalls: a seccomp filter on top of no_new_privs and no capabilities.
  FacetReport sys = Facet("syscalls", true);
  if (host.seccomp_filter) {
    sys.mechanisms = {"seccomp-bpf", "no_new_privs", "capabilities-dropped"};
    sys.level = Level::kFull;
    sys.notes.push_back("denied syscalls fail with EPERM and are reported by name (docs/seccomp.md); "
                        "x32 and i386 calls are refused");
  } else {
    sys.mechanisms = {"no_new_privs", "capabilities-dropped"};
    missing(sys, "seccomp filtering unavailable on this kernel: every syscall reaches the kernel");
  }
  r.facets.push_back(sys);

  // Resources: the wall clock is the supervisor's, tmpfs sizes and rlimits
  // the runner's; memory, cpu and the process count need a cgroup of ours.
  const ResourcesSpec& res = policy.resources;
  FacetReport rf = Facet("resources", res.cpu.requested() || res.memory_limit_bytes ||
                                          res.memory_guaranteed_bytes || res.disk_bytes ||
                                          res.wall_clock_ms || res.max_processes);
  rf.level = Level::kFull;
  if (res.wall_clock_ms) rf.mechanisms.push_back("supervisor-deadline");
  if (res.disk_bytes && landlock_only) {
    rf.mechanisms.push_back("rlimit-fsize");
    rf.notes.push_back("disk_gib: no file may grow past it (RLIMIT_FSIZE); the private directory is on a host "
                       "filesystem: its total disk use is not limited");
  } else if (res.disk_bytes) {
    rf.mechanisms.push_back("tmpfs-size");
    rf.mechanisms.push_back("rlimit-fsize");
    rf.notes.push_back("disk_gib: /tmp, HOME and /dev/shm are each a tmpfs of that size, and no file may "
                       "grow past it (RLIMIT_FSIZE)");
  }
  if (res.disk_bytes) AssessWorkspaceDisk(policy, inv, landlock_only, &rf, missing);
  rf.mechanisms.push_back("rlimit-core-0");
  rf.mechanisms.push_back("rlimit-nofile");
  std::vector<std::string> unenforced;
  auto cgroup_limit = [&](const char* what, const char* controller) {
    const char* where = host.cgroups.Where(controller);
    if (!where) {
      unenforced.push_back(what);
      return;
    }
    std::string m = std::string("cgroup-") + where + "-" + controller;
    if (std::find(rf.mechanisms.begin(), rf.mechanisms.end(), m) == rf.mechanisms.end()) {
      rf.mechanisms.push_back(m);
    }
    if (const char* dir = host.cgroups.DelegatedDir(controller)) {
      std::string note = std::string(controller) + ": delegated by setup-delegation at " + dir;
      if (std::find(rf.notes.begin(), rf.notes.end(), note) == rf.notes.end()) rf.notes.push_back(note);
    }
  };
  if (res.memory_limit_bytes || res.memory_guaranteed_bytes) cgroup_limit("memory_gib", "memory");
  if (res.memory_limit_bytes && host.cgroups.Where("memory")) {
    rf.notes.push_back("memory_gib.limit: a hard ceiling on the sandbox's memory, swap included "
                       "(swap is disabled for it); past it the kernel's OOM killer ends a process and "
                       "the outcome is oom_killed");
  }
  if (res.cpu.requested()) cgroup_limit("cpu", "cpu");
  std::string nproc_why;
  if (res.max_processes) {
    nproc_why = NprocInUsernsUnavailable(host, userns);
    if (host.cgroups.Where("pids") || !nproc_why.empty()) {
      cgroup_limit("max_processes", "pids");
    } else {
      rf.mechanisms.push_back("rlimit-nproc-userns");
      rf.notes.push_back("max_processes: RLIMIT_NPROC " + std::to_string(*res.max_processes) +
                         " (soft and hard), set inside the sandbox's own user namespace, where the kernel "
                         "counts its tasks alone (Linux 5.14+: per user namespace and uid): every process "
                         "and thread of the sandbox counts, agentbox-init included; a fork or clone past it "
                         "fails with EAGAIN; the command cannot raise it; no cgroup, so no peak count is "
                         "kept and what it leaves running is killed by the runner at the end");
    }
  }
  if (!unenforced.empty()) {
    std::string what;
    for (const auto& u : unenforced) what += (what.empty() ? "" : ", ") + u;
    std::string why = host.cgroups.reason.empty() ? "no cgroup of this process can give it to a child"
                                                  : host.cgroups.reason;
    missing(rf, what + ": not enforced: " + why);
    rf.notes.push_back("without a cgroup, rlimits cover what they can (core dumps off, NOFILE, FSIZE, and "
                       "NPROC inside the sandbox's user namespace)");
    if (res.memory_limit_bytes || res.memory_guaranteed_bytes) {
      rf.notes.push_back("memory_gib without a cgroup: nothing bounds the sandbox's total memory. RLIMIT_AS "
                         "and RLIMIT_DATA are per process (N processes may use N times the limit) and "
                         "count address space reserved, not memory used (runtimes that reserve large "
                         "heaps fail under them), so agentbox does not offer them as a memory limit; no "
                         "OOM kill is reported; `agentbox setup-delegation` gives this user a cgroup");
    }
    if (res.max_processes && !nproc_why.empty() && !host.cgroups.Where("pids")) {
      rf.notes.push_back("max_processes without a pids cgroup: " + nproc_why);
    }
  }
  r.facets.push_back(rf);

  // Credentials: none enter the sandbox (scrubbed env, private HOME, the
  // deny entries hidden); proxies are not built yet. The landlock-only
  // backend hides only deny entries outside every tree it grants: each one
  // inside is named in `missing`.
  FacetReport cred = Facet("credentials", true);
  cred.mechanisms = {"env-scrub"};
  const bool home_in_workspace = !inv.home.empty() && !inv.workspace.empty() &&
                                 paths::IsWithin(inv.home, inv.workspace);
  if (home_in_workspace && !landlock_only) {
    cred.notes.push_back("HOME " + inv.home + " lies in the workspace: it is the workspace's, not a private one; "
                         "the deny entries in it are masked");
  } else {
    cred.mechanisms.push_back("private-home");
  }
  cred.mechanisms.push_back(landlock_only ? "landlock-deny" : "deny-masks");
  cred.level = Level::kFull;
  if (landlock_only) {
    for (auto& gap : FenceLandlockOnly(policy, inv).gaps) r.missing.push_back(std::move(gap));
  }
  // Secrets, git credentials and L7 rules: the proxy's TLS terminator holds
  // and injects them; the sandbox gets placeholders and a per-run CA.
  if (Terminates(policy) && NeedsProxy(policy)) {
    cred.mechanisms.push_back("tls-terminator");
    if (!policy.credentials.secrets.empty()) {
      cred.mechanisms.push_back("secrets-injected-at-egress");
      std::string names;
      for (const auto& s : policy.credentials.secrets) names += (names.empty() ? "" : ", ") + s.name;
      cred.notes.push_back("secrets held by the supervisor in locked memory and added to requests to their hosts "
                           "only (" + names + "); the sandbox sees placeholders");
    }
    if (!policy.credentials.git_rules.remotes.empty() || !policy.credentials.git_rules.push.allow_refs.empty() ||
        policy.credentials.git_rules.push.deny_force) {
      cred.mechanisms.push_back("git-push-refs");
    }
  } else if (Terminates(policy)) {
    cred.notes.push_back("credentials.secrets / network.http_rules: no egress proxy (network.allow is empty), so "
                         "no request ever reaches a host they name");
  }
  if (policy.credentials.git == GitCredentials::kProxy && !Terminates(policy)) {
    cred.notes.push_back("credentials.git: proxy without a secret for a git host or credentials.git.remotes: git "
                         "over HTTPS goes through the proxy with no credentials added");
  }
  if (policy.credentials.tools != ToolCredentials::kNone) {
    missing(cred, std::string("credentials.tools: ") + ToString(policy.credentials.tools) +
                      ": the tool gateway's credential proxy is not available in this version");
  }
  r.facets.push_back(cred);

  if (policy.sandbox.snapshot_on_exit && !session) {
    r.missing.push_back({"sessions", "sandbox.snapshot_on_exit is honoured by sessions (agentbox serve, "
                                     "agentbox mcp), not by a single run"});
  }

  // Values that are honoured, but not as their name might suggest: said, not silent.
  if (!policy.sandbox.fresh_per_task && session) {
    r.notes.push_back("sandbox.fresh_per_task: false: the session works on the workspace itself (no layer of "
                      "its own, no diff or snapshot)");
  } else if (!policy.sandbox.fresh_per_task) {
    r.notes.push_back("sandbox.fresh_per_task: false: every run still starts with a fresh /tmp and HOME; "
                      "state that persists between runs belongs in the workspace");
  }
  if (!policy.network.deny.empty() && !NeedsProxy(policy)) {
    r.notes.push_back("network.deny: nothing outside the sandbox is reachable, so every entry holds");
  }
  if (policy.on_violation.escalation == Escalation::kOneTimeApproval) {
    r.notes.push_back("on_violation.escalation: one_time_approval: each denial a grant could lift lists its "
                      "escalation offer (the grant, and whether on_violation.max_grant allows it); a session's "
                      "agent asks for it through the daemon (POST /v1/sessions/{id}/escalations), `run "
                      "--on-denial ask` asks and runs the command once more with what was approved; otherwise a "
                      "denial stays a denial");
  }
  if (policy.on_violation.report_as == ReportAs::kTaskFailure) {
    r.notes.push_back("on_violation.report_as: task_failure: denials are listed, but the outcome "
                      "stays exited/signaled");
  }
  SettleLevels(&r);
  return r;
}

namespace {

// Hard refusals: asks that no `require: partial` can soften.
Status CheckHardRequirements(const Policy& policy, const Invocation& inv) {
  if (policy.mode == Mode::kDangerFullAccess) {
    if (!policy.credentials.secrets.empty()) {
      return Status::Error("confine", "credentials.secrets: danger-full-access runs unconfined, where nothing keeps "
                                      "a secret out of the command's reach; use workspace-write or read-only");
    }
    if (inv.workspace_overlay) {
      return Status::Error("confine", "--workspace-overlay: danger-full-access runs unconfined, with no mount "
                                      "namespace to hold the overlay");
    }
    return {};
  }
  if (Status s = CheckAvailable(policy); !s.ok()) return s;
  if (inv.workspace.empty() || inv.workspace[0] != '/') {
    return Status::Error("confine", "workspace '" + inv.workspace + "' is not an absolute path");
  }
  if (inv.workspace_overlay && !Writable(policy)) {
    return Status::Error("confine", "--workspace-overlay: the workspace is read-only under this policy: "
                                    "the run has nothing to write, let alone apply");
  }
  return {};
}

struct Mounted {
  std::string source;
  std::string target;
};

// Where a host path appears inside, through the deepest mount that holds it.
std::optional<std::string> InnerPath(const std::vector<Mounted>& mounted, const std::string& host) {
  const Mounted* best = nullptr;
  for (const auto& m : mounted) {
    if (paths::IsWithin(host, m.source) && (!best || m.source.size() > best->source.size())) {
      best = &m;
    }
  }
  if (!best) return std::nullopt;
  return paths::Rebase(host, best->source, best->target);
}

std::string EscapeRegex(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

// A regex for a glob pattern, matching a path token in an error message.
std::string GlobRegex(const std::string& glob) {
  std::string out;
  for (size_t i = 0; i < glob.size(); ++i) {
    char c = glob[i];
    if (c == '*' && i + 1 < glob.size() && glob[i + 1] == '*') {
      out += "[^\\s'\"]*";
      ++i;
      if (i + 1 < glob.size() && glob[i + 1] == '/') ++i;
    } else if (c == '*') {
      out += "[^\\s'\"/]*";
    } else if (c == '?') {
      out += "[^\\s'\"/]";
    } else {
      out += EscapeRegex(std::string(1, c));
    }
  }
  return out;
}

constexpr const char* kQuoteOpen = "(?:'|\"|‘|`)?";
constexpr const char* kQuoteClose = "(?:'|\"|’)?";
// errno texts as libc prints them, and in lower case as Node does.
constexpr const char* kErrnoText =
    "(?:[Pp]ermission denied|[Rr]ead-only file system|[Oo]peration not permitted|[Nn]o such file "
    "or directory|[Nn]ot a directory|[Dd]evice or resource busy|[Rr]esource busy or locked)";

// A path token followed or preceded by an errno text, in the three shapes
// tools print: `cat: PATH: Permission denied` (coreutils, shells, git, make),
// `[Errno 13] Permission denied: 'PATH'` (Python) and
// `EACCES: permission denied, open 'PATH'` (Node). `path` is a regex with no
// capture group of its own; the path is captured in group 1, 2 or 3.
std::string ErrnoShapes(const std::string& path, const std::string& errno_text) {
  return std::string(kQuoteOpen) + "(" + path + ")" + kQuoteClose + ": " + errno_text + "|" +  //
         errno_text + ": '(" + path + ")'|" +                                                   //
         errno_text + ", \\w+ '(" + path + ")'";
}

// A signature for a path that the policy withholds: the path (absolute
// inside, or any relative spelling ending in its workspace-relative part).
Signature PathSignature(const std::string& inner_abs, const std::string& relative,
                        const std::string& meaning) {
  std::string alt = EscapeRegex(inner_abs);
  if (!relative.empty()) alt += "|(?:[^\\s'\"‘`]*/)?" + EscapeRegex(relative);
  return {ErrnoShapes("(?:" + alt + ")(?:/[^\\s'\"’:]*)?", kErrnoText), meaning};
}

std::vector<Signature> DenialSignatures(const Plan& plan, const std::vector<std::string>& protect_rel) {
  std::vector<Signature> sigs;
  // Most specific first: the scanner reports the first signature that matches.
  for (size_t i = 0; i < protect_rel.size(); ++i) {
    sigs.push_back(PathSignature(paths::Join(plan.workspace_target, protect_rel[i]), protect_rel[i],
                                 "write to a protected path (filesystem.protect)"));
  }
  for (const auto& m : plan.mounts) {
    if (m.kind == MountKind::kMask && !paths::IsWithin(m.target, "/proc")) {
      std::string rel;
      if (paths::IsWithin(m.target, plan.workspace_target) && m.target != plan.workspace_target) {
        rel = m.target.substr(plan.workspace_target == "/" ? 1 : plan.workspace_target.size() + 1);
      }
      sigs.push_back(PathSignature(m.target, rel, "access to a denied path (" + m.why + ")"));
    }
  }
  for (const auto& g : plan.deny_globs) {
    for (const auto& pat : g.patterns) {
      sigs.push_back({ErrnoShapes("(?:[^\\s'\"‘`]*/)?" + GlobRegex(pat), kErrnoText),
                      "access to a denied path (filesystem.deny: " + pat + ")"});
    }
  }
  for (const auto& d : plan.absent) {
    sigs.push_back(PathSignature(d, "", "access to a path the sandbox does not mount (filesystem.deny)"));
  }
  // Writes anywhere outside the writable areas hit a read-only mount.
  sigs.push_back({ErrnoShapes("[^\\s'\"‘`]+", "(?:[Rr]ead-only file system|EROFS)"),
                  "write to a read-only path"});
  // Protected paths, their ancestors and masks are mount points: renaming or
  // removing one fails with EBUSY, which no ordinary workspace file does.
  sigs.push_back({"cannot (?:move|remove) (?:'|‘|\")([^'’\"]+)(?:'|’|\")[^\\n]*: Device or resource busy|" +
                      ErrnoShapes("[^\\s'\"‘`]+", "(?:[Dd]evice or resource busy|[Rr]esource busy or locked)"),
                  "rename or removal of a path the sandbox mounts in place (protected, pinned or masked)"});
  return sigs;
}

// A cache directory for `what`, unless the sandbox could write there: what
// is cached decides what is masked or filtered.
// agentbox's own directories (Invocation::own_dirs) are never in a sandbox:
// a workspace or read_only tree inside one is refused, and on the
// landlock-only backend (which cannot hide a path inside a tree it allows)
// so is one inside an allowed tree.
Status CheckOwnDirs(const Policy& policy, const Invocation& inv, bool landlock_only) {
  std::vector<std::pair<std::string, std::string>> trees = {{inv.workspace, "the workspace"}};
  for (const auto& entry : policy.filesystem.read_only) {
    std::string p = paths::ExpandHome(entry, inv.home);
    if (!p.empty()) trees.emplace_back(p, "filesystem.read_only '" + entry + "'");
  }
  for (const auto& entry : policy.filesystem.read_write) {
    std::string p = paths::ExpandHome(entry, inv.home);
    if (!p.empty()) trees.emplace_back(p, "filesystem.read_write '" + entry + "'");
  }
  for (const auto& cache : policy.filesystem.caches) {
    std::string p = paths::ExpandHome(cache.host, inv.home);
    if (!p.empty()) trees.emplace_back(p, "filesystem.caches." + cache.name + ".host '" + cache.host + "'");
  }
  for (const auto& d : inv.own_dirs) {
    for (const auto& [tree, what] : trees) {
      if (paths::IsWithin(tree, d)) {
        return Status::Error("confine", what + " (" + tree + ") is inside agentbox's own state directory " + d +
                                            ", which no sandbox may see");
      }
      if (landlock_only && paths::IsWithin(d, tree)) {
        return Status::Error("confine", "agentbox's own state directory " + d + " is inside " + what + " (" + tree +
                                            "), and the landlock-only backend cannot hide a path inside a tree it "
                                            "allows; use the namespaces backend or a workspace that does not hold it");
      }
    }
  }
  return {};
}

std::string CacheDirFor(const Invocation& inv, const char* what) {
  if (inv.cache_dir.empty() || inv.cache_dir[0] != '/' || paths::IsWithin(inv.cache_dir, inv.workspace)) return "";
  return paths::Join(inv.cache_dir, what);
}

// filesystem.read_write, filesystem.caches and home.import: host trees the
// namespaces backend binds at `target`, and the landlock-only backend
// grants and links into its private home (at `home_rel`).
struct ExtraTree {
  enum class Kind { kReadWrite, kCache, kImport };
  Kind kind = Kind::kReadWrite;
  std::string source;    // host path
  std::string target;    // inside, given the sandbox's home (namespaces)
  std::string home_rel;  // relative to the sandbox's home, for `~/…` entries ("" otherwise)
  bool writable = false;
  bool optional = false;
  std::string why;
};

std::string HomeRelative(const std::string& entry) { return entry.rfind("~/", 0) == 0 ? entry.substr(2) : ""; }

// Whether the host path `p` is, holds or lies in a filesystem.deny entry;
// the entry when it does.
std::optional<std::string> DeniedBy(const Policy& policy, const Invocation& inv, const std::string& p) {
  for (const auto& entry : policy.filesystem.deny) {
    std::string d = paths::ExpandHome(entry, inv.home);
    if (d.empty() || d[0] != '/') continue;  // workspace-relative: the workspace's own
    if (!paths::HasGlob(d)) {
      if (paths::IsWithin(p, d) || paths::IsWithin(d, p)) return entry;
      continue;
    }
    std::string root = paths::Parent(d.substr(0, d.find_first_of("*?[") + 1));
    if (!paths::IsWithin(p, root) || p == root) continue;
    const std::size_t cut = root == "/" ? 1 : root.size() + 1;
    if (GlobMatch(d.substr(cut), p.substr(cut))) return entry;
  }
  return std::nullopt;
}

// `sandbox_home`: HOME inside ("" on landlock-only, where it is per run).
Result<std::vector<ExtraTree>> PlanExtraTrees(const Policy& policy, const Invocation& inv,
                                              const std::string& sandbox_home, std::vector<std::string>* cache_dirs) {
  std::vector<ExtraTree> out;
  auto no_home = [](const std::string& what) {
    return Status::Error("confine", what + ": no HOME to expand ~ against");
  };
  for (const auto& entry : policy.filesystem.read_write) {
    ExtraTree t;
    t.source = paths::ExpandHome(entry, inv.home);
    if (t.source.empty()) return no_home("filesystem.read_write '" + entry + "'");
    t.target = t.source;
    t.home_rel = HomeRelative(entry);
    t.writable = true;
    t.why = "filesystem.read_write: " + entry;
    out.push_back(std::move(t));
  }
  for (const auto& cache : policy.filesystem.caches) {
    const std::string key = "filesystem.caches." + cache.name;
    ExtraTree t;
    t.kind = ExtraTree::Kind::kCache;
    if (cache.host.empty()) {
      const std::string root = CacheDirFor(inv, "caches");
      if (root.empty()) {
        return Status::Error("confine", key + ": agentbox has no cache directory for it here (neither "
                                              "$XDG_CACHE_HOME nor HOME is set, or it lies in the workspace)");
      }
      t.source = paths::Join(root, cache.name);
      cache_dirs->push_back(t.source);
    } else {
      t.source = paths::ExpandHome(cache.host, inv.home);
      if (t.source.empty()) return no_home(key + ".host '" + cache.host + "'");
    }
    t.home_rel = HomeRelative(cache.path);
    t.target = t.home_rel.empty() ? cache.path : paths::Join(sandbox_home, t.home_rel);
    t.writable = true;
    t.why = key + ": " + cache.path + (cache.host.empty() ? "" : " (host " + cache.host + ")");
    out.push_back(std::move(t));
  }
  for (const auto& rel : policy.home.import) {
    if (inv.home.empty()) return no_home("home.import '" + rel + "'");
    ExtraTree t;
    t.kind = ExtraTree::Kind::kImport;
    t.source = paths::Join(inv.home, rel);
    // A dotfile the policy hides stays hidden: deny wins over import.
    if (auto denied = DeniedBy(policy, inv, t.source)) {
      return Status::Error("confine", "home.import '" + rel + "' (" + t.source + ") overlaps filesystem.deny '" +
                                          *denied + "', which keeps it out of the sandbox");
    }
    t.home_rel = rel;
    t.target = paths::Join(sandbox_home, rel);
    t.optional = true;
    t.why = "home.import: " + rel;
    out.push_back(std::move(t));
  }
  return out;
}

// The report's word on the trees above, in the filesystem facet.
void NoteExtraTrees(const std::vector<ExtraTree>& trees, EnforcementReport* r) {
  std::string rw, caches, imports;
  for (const auto& t : trees) {
    switch (t.kind) {
      case ExtraTree::Kind::kReadWrite: rw += (rw.empty() ? "" : ", ") + t.source; break;
      case ExtraTree::Kind::kCache:
        caches += (caches.empty() ? "" : ", ") + t.why.substr(std::string("filesystem.caches.").size()) + " from " +
                  t.source;
        break;
      case ExtraTree::Kind::kImport: imports += (imports.empty() ? "" : ", ") + t.home_rel; break;
    }
  }
  for (auto& f : r->facets) {
    if (f.name != "filesystem") continue;
    if (!rw.empty()) f.notes.push_back("filesystem.read_write, writable outside the workspace: " + rw);
    if (!caches.empty()) f.notes.push_back("filesystem.caches, writable and kept across runs: " + caches);
    if (!imports.empty()) {
      f.notes.push_back("home.import, read-only in the sandbox's home (missing ones under skipped): " + imports);
    }
  }
}

// Landlock-only: the home links, nested ones dropped when an outer link
// reaches the same host path already; any other overlap is refused (a link
// made inside another link's target would land in the host's tree).
Status AddHomeLinks(std::vector<HomeLink> links, Plan* plan) {
  std::stable_sort(links.begin(), links.end(),
                   [](const HomeLink& a, const HomeLink& b) { return paths::Depth(a.name) < paths::Depth(b.name); });
  for (auto& link : links) {
    bool covered = false;
    for (const auto& outer : plan->home_links) {
      if (!paths::IsWithin(link.name, outer.name)) continue;
      if (paths::Rebase(link.name, outer.name, outer.target) != link.target) {
        return Status::Error("confine", link.why + " lies in ~/" + outer.name + " (" + outer.why + "), which the "
                                           "landlock-only backend gives as a link to " + outer.target +
                                           "; without a mount namespace one cannot be placed inside the other");
      }
      covered = true;
      break;
    }
    if (!covered) plan->home_links.push_back(std::move(link));
  }
  return {};
}

}  // namespace

namespace {
Result<ConfinedCommand> ConfinePolicy(const std::vector<std::string>& argv, const Policy& policy,
                                      const HostCaps& host, const Invocation& inv);
}  // namespace

std::string DescribeBrokeredTls(const NetworkPlan& n) {
  if (!n.broker || !n.sni_check) return "";
  std::string keep;
  if (n.inspect_tls_all) {
    keep = "network.inspect_tls is true: all hosts keep the relay and the SNI check";
  } else {
    keep = "network.inspect_tls lists the hosts that keep the relay and the SNI check: ";
    if (n.inspect_tls.empty()) keep += "none";
    for (std::size_t i = 0; i < n.inspect_tls.size(); ++i) keep += (i ? ", " : "") + n.inspect_tls[i];
  }
  // A connection handed over as is never passes the relay, so nothing
  // compares its ClientHello with the name it was allowed for.
  return "connections the broker installs directly carry no SNI check, so domain fronting to another tenant of "
         "an allowed address is possible there; " + keep;
}

Result<ConfinedCommand> Confine(const std::vector<std::string>& argv, const Policy& policy,
                                const HostCaps& host, const Invocation& inv) {
  // A secret read from a file is the supervisor's to read: the file is
  // denied inside like any filesystem.deny entry (a token under /etc or in
  // the workspace would otherwise be one `cat` away).
  const bool file_secret = std::any_of(policy.credentials.secrets.begin(), policy.credentials.secrets.end(),
                                       [](const SecretSpec& s) { return s.from.kind == SecretSource::Kind::kFile; });
  // A secret with no hosts is the tool gateway's (tools.upstream): it goes
  // to no request of the sandbox's, so the sandbox's supervisor never
  // holds it.
  const bool gateway_secret = std::any_of(policy.credentials.secrets.begin(), policy.credentials.secrets.end(),
                                          [](const SecretSpec& s) { return s.hosts.empty(); });
  if ((!file_secret || !Confines(policy)) && !gateway_secret) return ConfinePolicy(argv, policy, host, inv);
  Policy narrowed = policy;
  for (const auto& s : policy.credentials.secrets) {
    if (s.from.kind != SecretSource::Kind::kFile || !Confines(policy)) continue;
    auto& deny = narrowed.filesystem.deny;
    if (std::find(deny.begin(), deny.end(), s.from.file) == deny.end()) deny.push_back(s.from.file);
  }
  std::erase_if(narrowed.credentials.secrets, [](const SecretSpec& s) { return s.hosts.empty(); });
  return ConfinePolicy(argv, narrowed, host, inv);
}

namespace {

Result<ConfinedCommand> ConfinePolicy(const std::vector<std::string>& argv, const Policy& policy,
                                      const HostCaps& host, const Invocation& inv) {
  if (argv.empty()) return Status::Error("confine", "no command given");
  if (Status s = CheckHardRequirements(policy, inv); !s.ok()) return s;

  ConfinedCommand out;
  bool landlock_only = false;
  const bool gvisor = Confines(policy) && policy.sandbox.isolation == Isolation::kContainer;
  const bool microvm = Confines(policy) && policy.sandbox.isolation == Isolation::kMicrovm;
  if (microvm) {
    if (const std::string lack = MicrovmLack(policy, host, inv); !lack.empty()) {
      return Status::Error("confine", "sandbox.isolation: microvm: " + lack + "; refusing rather than downgrading");
    }
    if (inv.backend != BackendChoice::kAuto) {
      return Status::Error("confine", "--backend: sandbox.isolation: microvm runs on a guest kernel; --backend "
                                      "chooses between the host-kernel backends of isolation: os");
    }
    if (const std::string lack = NamespacesLack(host); !lack.empty() && host.uid != 0) {
      return Status::Error("confine", "sandbox.isolation: microvm: " + lack + " (virtiofsd runs in a user namespace "
                                      "of agentbox's without root); refusing rather than downgrading");
    }
  } else if (gvisor) {
    // Never a downgrade: a host without gVisor refuses, under any `require`.
    if (const std::string lack = ContainerLack(policy, host, inv); !lack.empty()) {
      return Status::Error("confine", "sandbox.isolation: container: " + lack + "; refusing rather than downgrading");
    }
    if (inv.backend != BackendChoice::kAuto) {
      return Status::Error("confine", "--backend: sandbox.isolation: container runs on gVisor; --backend chooses "
                                      "between the host-kernel backends of isolation: os");
    }
  } else if (Confines(policy)) {
    auto selected = SelectBackend(host, inv.backend);
    if (!selected.ok()) return selected.status();
    landlock_only = selected->backend == Backend::kLandlockOnly;
    if (landlock_only && inv.workspace_overlay) {
      return Status::Error("confine", "--workspace-overlay needs the namespaces backend: the landlock-only backend (" +
                                          selected->why + ") has no mount namespace to hold the overlay; run "
                                          "without it (disk_gib then bounds the workspace only where a project "
                                          "quota can)");
    }
  }
  out.enforcement = AssessEnforcement(policy, host, inv);
  const bool writable = Writable(policy);
  std::vector<std::string> absent;
  if (Confines(policy)) {
    if (Status s = CheckOwnDirs(policy, inv, landlock_only); !s.ok()) return s;
  }
  if (landlock_only) {
    // agentbox's own directories lie outside every allowed tree
    // (CheckOwnDirs): Landlock denies them like anything else there.
    absent = FenceLandlockOnly(policy, inv).absent;
    if (!policy.filesystem.workspace.path.empty() && policy.filesystem.workspace.path != inv.workspace) {
      out.enforcement.notes.push_back("filesystem.workspace.path '" + policy.filesystem.workspace.path +
                                      "': without a mount namespace the workspace stays at its host path " +
                                      inv.workspace);
    }
  }
  if (!out.enforcement.missing.empty() && policy.sandbox.require == Requirement::kFull) {
    std::string msg = "the policy requires full enforcement and this host/version cannot give it:";
    for (const auto& m : out.enforcement.missing) msg += "\n  - " + m.facet + ": " + m.reason;
    msg += "\n(use --require partial to run with what is available; the report lists what is missing)";
    return Status::Error("confine", msg);
  }

  Plan& plan = out.plan;
  plan.argv = argv;
  plan.uid = host.uid;
  plan.gid = host.gid;
  plan.nonce = inv.nonce;
  plan.policy_sha256 = policy.sha256;
  plan.timeout_ms = policy.resources.wall_clock_ms;
  if (policy.resources.kill_grace_ms) plan.kill_grace_ms = *policy.resources.kill_grace_ms;
  if (Confines(policy)) {
    // Only what this host enforces goes into the plan (the rest is reported
    // missing above): the launcher then never meets a limit it cannot set.
    const ResourcesSpec& res = policy.resources;
    ResourceLimits& lim = plan.limits;
    if (host.cgroups.Where("memory")) {
      lim.memory_max_bytes = res.memory_limit_bytes;
      lim.memory_low_bytes = res.memory_guaranteed_bytes;
    }
    if (host.cgroups.Where("cpu")) {
      lim.cpu_max_cores = res.cpu.limit;
      lim.cpu_weight_cores = res.cpu.guaranteed;
    }
    if (host.cgroups.Where("pids")) {
      lim.pids_max = res.max_processes;
    } else if (NprocInUsernsUnavailable(host, !landlock_only && host.user_namespaces).empty()) {
      lim.nproc = res.max_processes;
    }
    lim.fsize_bytes = res.disk_bytes;
  }
  plan.denial_outcome = policy.on_violation.report_as == ReportAs::kSandboxDenial;
  plan.workspace_source = inv.workspace;
  plan.workspace_target =
      policy.filesystem.workspace.path.empty() ? inv.workspace : policy.filesystem.workspace.path;
  plan.workspace_writable = writable;
  // disk_gib on the host workspace by a project quota: where the assessment
  // chose it (no overlay, a filesystem with project quotas, root).
  const auto& mech = FindFacet(out.enforcement, "resources");
  if (Confines(policy) && policy.resources.disk_bytes &&
      std::find(mech.begin(), mech.end(), "project-quota") != mech.end()) {
    plan.workspace_quota = WorkspaceQuotaPlan{inv.workspace_fs.device, *policy.resources.disk_bytes};
  }

  if (!Confines(policy)) {
    plan.confined = false;
    plan.cwd = inv.cwd;
    plan.env.pass_all = true;
    plan.env.set = policy.env.set;
    plan.home = inv.home;
  } else if (landlock_only) {
    // No namespaces, no mounts: host paths, fenced by Landlock. HOME and
    // TMPDIR come with the per-run private directory (AdoptPrivateDir).
    plan.backend = Backend::kLandlockOnly;
    plan.workspace_target = inv.workspace;
    plan.absent = std::move(absent);
    std::vector<std::string> read_only;
    for (const auto& entry : policy.filesystem.read_only) {
      std::string p = paths::ExpandHome(entry, inv.home);
      if (!p.empty()) read_only.push_back(p);
    }
    // Landlock is the only filesystem fence here: a kernel without it refuses.
    plan.landlock = PlanLandlockOnly(read_only, inv.workspace, writable, host.landlock_abi, true);
    // `~/…` entries are where the policy says only through links in the
    // private home (HOME points there, not at the caller's home).
    auto extra = PlanExtraTrees(policy, inv, "", &plan.cache_dirs);
    if (!extra.ok()) return extra.status();
    std::vector<HomeLink> links;
    for (const auto& entry : policy.filesystem.read_only) {
      std::string rel = HomeRelative(entry);
      if (!rel.empty() && !inv.home.empty()) {
        links.push_back({rel, paths::ExpandHome(entry, inv.home), true, "filesystem.read_only: " + entry});
      }
    }
    for (const auto& t : *extra) {
      AddLandlockTree(&plan.landlock, t.source, t.writable, t.optional, t.why);
      if (!t.home_rel.empty()) {
        links.push_back({t.home_rel, t.source, t.optional, t.why});
      } else if (t.kind == ExtraTree::Kind::kCache) {
        return Status::Error("confine", t.why + ": the landlock-only backend has no mount namespace to place a "
                                               "cache outside the home; give it as ~/…");
      }
    }
    if (Status s = AddHomeLinks(std::move(links), &plan); !s.ok()) return s;
    NoteExtraTrees(*extra, &out.enforcement);
    for (const auto& entry : policy.filesystem.unix_sockets) {
      std::string p = paths::ExpandHome(entry, inv.home);
      if (!p.empty()) plan.unix_sockets.push_back(p);
    }
    plan.seccomp = PlanSeccomp(host.seccomp_filter, SocketScope::kHostNetwork);
    if (Status s = GrantSyscalls(policy.granted.syscalls, &plan.seccomp); !s.ok()) return s;
    plan.seccomp.cache_dir = CacheDirFor(inv, "seccomp");
    // The connect() broker decides TCP past the proxy's ports (no DNS is
    // served: there is no namespace to serve it in).
    plan.network.broker = plan.seccomp.enabled;
    // The proxy's ports are the supervisor's to bind, per run, on the host's
    // loopback (AdoptProxyPorts): 0 until then.
    if (NeedsProxy(policy)) PlanEgress(policy, ProxyPorts{0, 0}, &plan.network);
    plan.cwd = paths::IsWithin(inv.cwd, inv.workspace) ? inv.cwd : inv.workspace;
    plan.private_dir_parent = inv.runtime_dir.empty() ? "/tmp" : inv.runtime_dir;
    plan.env.pass = policy.env.pass;
    plan.env.set = policy.env.set;
    const bool path_set = std::any_of(plan.env.set.begin(), plan.env.set.end(),
                                      [](const auto& kv) { return kv.first == "PATH"; });
    if (!path_set && std::find(plan.env.pass.begin(), plan.env.pass.end(), "PATH") == plan.env.pass.end()) {
      plan.env.set.emplace_back("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin");
    }
    out.denial_signatures = DenialSignatures(plan, {});
  } else {
    plan.namespaces = {"user", "mnt", "pid", "net", "ipc", "uts"};
    // A container's seccomp profile may refuse sethostname even in our own
    // uts namespace: the namespace stays, with the container's name in it.
    if (host.sethostname_errno > 0) plan.hostname.clear();
    if (host.cgroup_ns) plan.namespaces.push_back("cgroup");
    const std::uint64_t tmp_bytes = policy.resources.disk_bytes.value_or(kDefaultTmpBytes);
    auto& mounts = plan.mounts;
    std::vector<Mounted> mounted;  // host trees visible inside, for masks

    mounts.push_back({MountKind::kTmpfs, "", "/", false, false, "mode=0755,size=16m", "new root"});
    bool usr_bound = false;
    for (const auto& entry : policy.filesystem.read_only) {
      std::string p = paths::ExpandHome(entry, inv.home);
      if (p.empty()) continue;
      mounts.push_back({MountKind::kBind, p, p, true, true, "", "filesystem.read_only: " + entry});
      mounted.push_back({p, p});
      if (p == "/usr") usr_bound = true;
    }
    if (usr_bound) {
      // Merged-/usr systems reach the dynamic loader through /lib64 -> usr/lib64:
      // recreate such links (only where the host has them as links).
      for (const char* link : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
        bool listed = std::any_of(mounts.begin(), mounts.end(),
                                  [&](const MountOp& m) { return m.target == link; });
        if (!listed) {
          mounts.push_back({MountKind::kSymlink, "", link, false, true, "", "merged-/usr link"});
        }
      }
    }

    mounts.push_back({MountKind::kTmpfs, "", "/dev", false, false, "mode=0755,size=64k", "minimal /dev"});
    for (const char* dev : {"null", "zero", "full", "random", "urandom", "tty"}) {
      std::string p = std::string("/dev/") + dev;
      mounts.push_back({MountKind::kDevice, p, p, false, false, "", "minimal /dev"});
    }
    mounts.push_back({MountKind::kDevpts, "", "/dev/pts", false, false,
                      "newinstance,ptmxmode=0666,mode=620", "new devpts instance"});
    mounts.push_back({MountKind::kSymlink, "pts/ptmx", "/dev/ptmx", false, false, "", "minimal /dev"});
    mounts.push_back({MountKind::kTmpfs, "", "/dev/shm", false, false,
                      "mode=1777,size=" + SizeText(tmp_bytes), "shared memory"});
    mounts.push_back({MountKind::kSymlink, "/proc/self/fd", "/dev/fd", false, false, "", "minimal /dev"});
    mounts.push_back({MountKind::kSymlink, "/proc/self/fd/0", "/dev/stdin", false, false, "", "minimal /dev"});
    mounts.push_back({MountKind::kSymlink, "/proc/self/fd/1", "/dev/stdout", false, false, "", "minimal /dev"});
    mounts.push_back({MountKind::kSymlink, "/proc/self/fd/2", "/dev/stderr", false, false, "", "minimal /dev"});

    mounts.push_back({MountKind::kProc, "", "/proc", false, false, "", "procfs of the sandbox's pid namespace"});
    for (const char* f : {"/proc/kcore", "/proc/keys", "/proc/sysrq-trigger", "/proc/timer_list",
                          "/proc/sched_debug", "/proc/kallsyms"}) {
      mounts.push_back({MountKind::kMask, "", f, false, true, "", "masked kernel interface"});
    }
    mounts.push_back({MountKind::kReadOnly, "", "/proc/sys", true, false, "", "/proc/sys read-only"});

    mounts.push_back({MountKind::kTmpfs, "", "/tmp", false, false,
                      "mode=1777,size=" + SizeText(tmp_bytes), "private /tmp"});

    // HOME: private and writable, at the usual path, unless the workspace holds it.
    std::string home = inv.home.empty() || inv.home == "/" ? "/home/sandbox" : inv.home;
    plan.home = paths::IsWithin(home, inv.workspace) ? paths::Rebase(home, inv.workspace, plan.workspace_target)
                                                    : home;
    if (!paths::IsWithin(home, inv.workspace)) {
      mounts.push_back({MountKind::kTmpfs, "", home, false, false,
                        "mode=0700,size=" + SizeText(tmp_bytes), "private HOME"});
    }

    // read_write trees at their own paths (deny masks apply inside them, as
    // in the workspace), caches and imported dotfiles in the private home.
    auto extra = PlanExtraTrees(policy, inv, plan.home, &plan.cache_dirs);
    if (!extra.ok()) return extra.status();
    for (const auto& t : *extra) {
      mounts.push_back({MountKind::kBind, t.source, t.target, !t.writable, t.optional, "", t.why});
      if (t.kind == ExtraTree::Kind::kReadWrite) mounted.push_back({t.source, t.target});
    }
    NoteExtraTrees(*extra, &out.enforcement);

    if (inv.workspace_overlay) {
      // The run's writes go to an upper layer on a capped tmpfs the runner
      // makes; the supervisor applies it (or not) when the run ends.
      mounts.push_back({MountKind::kOverlay, inv.workspace, plan.workspace_target, false, false, "",
                        "workspace (overlay: the run's changes are applied at its end)"});
      WorkspaceOverlay overlay;
      overlay.upper = "upper";
      overlay.work = "work";
      overlay.tmpfs_bytes = policy.resources.disk_bytes.value_or(kDefaultTmpBytes);
      overlay.apply = *inv.workspace_overlay;
      plan.workspace_overlay = overlay;
    } else {
      mounts.push_back({MountKind::kBind, inv.workspace, plan.workspace_target, !plan.workspace_writable,
                        false, "", plan.workspace_writable ? "workspace (read-write)" : "workspace (read-only)"});
    }
    mounted.push_back({inv.workspace, plan.workspace_target});

    // deny: absent by construction; masked where it falls inside a mounted tree.
    for (const auto& entry : policy.filesystem.deny) {
      std::string p = paths::ExpandHome(entry, inv.home);
      if (p.empty()) continue;
      if (p[0] != '/') p = paths::Join(inv.workspace, p);
      if (paths::HasGlob(p)) {
        // Scan from the deepest glob-free directory; where that lies above the
        // mounted trees (e.g. ~/**/.env with the workspace under ~), scan each
        // mounted tree below it instead, matching paths relative to that directory.
        std::string root = paths::Parent(p.substr(0, p.find_first_of("*?[") + 1));
        std::string rel = p.substr(root == "/" ? 1 : root.size() + 1);
        bool scanned = false;
        for (const auto& m : mounted) {
          if (paths::IsWithin(root, m.source)) {
            plan.deny_globs.push_back({root, *InnerPath(mounted, root), "", {rel}});
            scanned = true;
            break;
          }
        }
        for (const auto& m : mounted) {
          if (!scanned && paths::IsWithin(m.source, root) && m.source != root) {
            std::string base = m.source.substr(root == "/" ? 1 : root.size() + 1);
            plan.deny_globs.push_back({m.source, m.target, base, {rel}});
            scanned = true;
          }
        }
        if (!scanned) plan.absent.push_back(p);
        continue;
      }
      for (const auto& m : mounted) {
        if (paths::IsWithin(m.source, p)) {
          return Status::Error("confine", "filesystem.deny: '" + entry + "' contains '" + m.source +
                                              "', which the policy also mounts");
        }
      }
      auto inner = InnerPath(mounted, p);
      if (!inner) {
        plan.absent.push_back(p);
        continue;
      }
      mounts.push_back({MountKind::kMask, p, *inner, true, true, "", "filesystem.deny: " + entry});
    }
    // agentbox's own directories: a policy cannot lift this (CheckOwnDirs
    // made sure none holds a mounted tree).
    for (const auto& d : inv.own_dirs) {
      // Outside every mounted tree: absent, with nothing to plan (and no
      // stderr signature: there may be many, and no command names them).
      auto inner = InnerPath(mounted, d);
      if (!inner) continue;
      mounts.push_back({MountKind::kMask, d, *inner, true, true, "", "agentbox's own state (always hidden)"});
    }
    // Merge scans of the same root.
    std::vector<GlobScan> merged;
    for (auto& g : plan.deny_globs) {
      auto it = std::find_if(merged.begin(), merged.end(), [&](const GlobScan& m) {
        return m.source_root == g.source_root && m.pattern_base == g.pattern_base;
      });
      if (it == merged.end()) {
        merged.push_back(g);
      } else {
        it->patterns.insert(it->patterns.end(), g.patterns.begin(), g.patterns.end());
      }
    }
    plan.deny_globs = std::move(merged);
    // The scan cache decides what gets masked: never where the sandbox can write.
    if (!plan.deny_globs.empty()) plan.scan_cache_dir = CacheDirFor(inv, "deny-scan");

    // protect: read-only inside the writable workspace; every ancestor between
    // the workspace root and it pinned, so that no rename can move it away.
    std::vector<std::string> protect_rel;
    if (plan.workspace_writable) {
      std::set<std::string> pinned;
      for (const auto& entry : policy.filesystem.protect) {
        std::string p = entry[0] == '/' ? entry : paths::Join(inv.workspace, entry);
        if (p[0] == '/' && !paths::IsWithin(p, inv.workspace) &&
            paths::IsWithin(p, plan.workspace_target) && plan.workspace_target != inv.workspace) {
          p = paths::Rebase(p, plan.workspace_target, inv.workspace);  // given as an inside path
        }
        if (!paths::IsWithin(p, inv.workspace) || p == inv.workspace) {
          if (p == inv.workspace) {
            return Status::Error("confine", "filesystem.protect: '" + entry +
                                                "' is the whole workspace; use mode read-only");
          }
          continue;  // outside the workspace: read-only or absent already
        }
        for (std::string a = paths::Parent(p); a != inv.workspace && paths::IsWithin(a, inv.workspace);
             a = paths::Parent(a)) {
          if (pinned.insert(a).second) {
            mounts.push_back({MountKind::kPin, a, paths::Rebase(a, inv.workspace, plan.workspace_target),
                              false, false, "", "ancestor of protected " + entry});
          }
        }
        mounts.push_back({MountKind::kProtect, p, paths::Rebase(p, inv.workspace, plan.workspace_target),
                          true, false, "", "filesystem.protect: " + entry});
        protect_rel.push_back(p.substr(inv.workspace == "/" ? 1 : inv.workspace.size() + 1));
        // `.git/NAME` at the workspace root: the same NAME in every other
        // repository of the workspace (a clone in a subfolder runs its hooks
        // on the host just as well).
        const std::string& rel = protect_rel.back();
        if (rel.rfind(".git/", 0) == 0 && rel.find('/', 5) == std::string::npos && rel.size() > 5 &&
            std::find(plan.protect_git.begin(), plan.protect_git.end(), rel.substr(5)) == plan.protect_git.end()) {
          plan.protect_git.push_back(rel.substr(5));
        }
      }
      // Finding the repositories shares the deny scan's cache.
      if (!plan.protect_git.empty() && plan.scan_cache_dir.empty()) {
        plan.scan_cache_dir = CacheDirFor(inv, "deny-scan");
      }
    }

    // protect inside a read_write tree: a read-only bind of the path onto
    // itself, every ancestor below the tree's root pinned. It must exist
    // (there is no placeholder outside the workspace): else the launch fails.
    std::set<std::string> rw_pinned;
    for (const auto& entry : policy.filesystem.protect) {
      if (entry[0] != '/') continue;
      auto tree = std::find_if(extra->begin(), extra->end(), [&](const ExtraTree& t) {
        return t.kind == ExtraTree::Kind::kReadWrite && paths::IsWithin(entry, t.source);
      });
      if (tree == extra->end()) continue;
      if (entry == tree->source) {
        return Status::Error("confine", "filesystem.protect: '" + entry + "' is the whole " + tree->why +
                                            " entry; list it under read_only instead");
      }
      for (std::string a = paths::Parent(entry); a != tree->source; a = paths::Parent(a)) {
        if (rw_pinned.insert(a).second) {
          mounts.push_back({MountKind::kPin, a, a, false, false, "", "ancestor of protected " + entry});
        }
      }
      mounts.push_back({MountKind::kBind, entry, entry, true, false, "",
                        "filesystem.protect: " + entry + " (in " + tree->why + ")"});
    }

    // unix_sockets: each socket the policy names is bound in at its own
    // path (inside a private HOME, say); connect() to it is then allowed.
    for (const auto& entry : policy.filesystem.unix_sockets) {
      std::string p = paths::ExpandHome(entry, inv.home);
      if (p.empty()) continue;
      auto inner = InnerPath(mounted, p);
      const std::string target = inner ? *inner : p;
      if (!inner) {
        mounts.push_back({MountKind::kBind, p, p, false, true, "", "filesystem.unix_sockets: " + entry});
      }
      plan.unix_sockets.push_back(target);
    }

    // The terminator's CA (and the roots the supervisor trusts, appended by
    // the runner from the host file the supervisor names) for the tools
    // inside: filled in at launch, when the run's CA exists.
    if (NeedsProxy(policy) && Terminates(policy)) {
      mounts.push_back({MountKind::kFile, "", kCaBundlePath, true, true, "",
                        "the TLS terminator's per-run CA (credentials, network.http_rules)"});
    }

    // on_violation.max_grant's filesystem trees: Landlock rules attach at
    // launch, so a grant grafted into the running world later (World::
    // GraftPath) is allowed only below a tree that has a rule now. Each
    // ceiling tree outside every mounted tree is an empty directory on the
    // root tmpfs with such a rule; one inside a mounted tree has its rules.
    // What a grant shows is still the mount plan's alone: nothing is
    // mounted there until a grant is.
    if (Confines(policy) && policy.on_violation.escalation == Escalation::kOneTimeApproval) {
      PlanCeilingDirs(policy, inv, &mounts);
    }

    // Parents before children; the root tmpfs stays first.
    std::stable_sort(mounts.begin() + 1, mounts.end(), [](const MountOp& a, const MountOp& b) {
      return paths::Depth(a.target) < paths::Depth(b.target);
    });

    // The layers stacked on the mounts: Landlock mirrors the final mount list.
    plan.landlock = PlanLandlock(plan, host.landlock_abi, policy.sandbox.require == Requirement::kFull);
    plan.seccomp = PlanSeccomp(host.seccomp_filter);
    if (Status s = GrantSyscalls(policy.granted.syscalls, &plan.seccomp); !s.ok()) return s;
    plan.seccomp.cache_dir = CacheDirFor(inv, "seccomp");
    // Transparent egress: the seccomp filter's connect() notifications go to
    // the supervisor's broker, and DNS is served inside the namespace.
    if (plan.seccomp.enabled &&
        std::find(plan.namespaces.begin(), plan.namespaces.end(), "net") != plan.namespaces.end()) {
      plan.network.broker = true;
      plan.network.dns_address = kDnsAddressInside;
    }

    std::string cwd = paths::IsWithin(inv.cwd, inv.workspace)
                          ? paths::Rebase(inv.cwd, inv.workspace, plan.workspace_target)
                          : plan.workspace_target;
    plan.cwd = cwd;

    plan.env.pass = policy.env.pass;
    plan.env.set = policy.env.set;
    auto has = [&](const std::string& name) {
      return std::any_of(plan.env.set.begin(), plan.env.set.end(),
                         [&](const auto& kv) { return kv.first == name; });
    };
    if (!has("HOME")) plan.env.set.emplace_back("HOME", plan.home);
    if (!has("TMPDIR")) plan.env.set.emplace_back("TMPDIR", "/tmp");
    if (!has("PATH") && std::find(plan.env.pass.begin(), plan.env.pass.end(), "PATH") == plan.env.pass.end()) {
      plan.env.set.emplace_back("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin");
    }
    if (NeedsProxy(policy)) {
      // Egress through the supervisor's proxy, whose listeners the runner
      // creates inside the network namespace.
      PlanEgress(policy, ProxyPorts{}, &plan.network);
      SetProxyEnv(&plan.env, *plan.network.proxy, "localhost,127.0.0.1");
      if (plan.network.terminate) {
        plan.network.ca_bundle = kCaBundlePath;
        SetTrustEnv(&plan.env, kCaBundlePath);
      }
    }
    out.denial_signatures = DenialSignatures(plan, protect_rel);
    if (gvisor) {
      // The same mount plan, given to runsc as an OCI spec. No broker and no
      // DNS inside: egress, if any, is the proxy variables' alone, on
      // listeners in a network namespace the supervisor prepares.
      plan.backend = Backend::kGvisor;
      plan.network.broker = false;
      plan.network.dns_address.clear();
      plan.landlock = LandlockPlan{};
      plan.limits.pids_max.reset();
      plan.limits.nproc = policy.resources.max_processes;
      const LadderCaps& l = host.ladder;
      plan.gvisor = GvisorPlan{l.runsc, l.runsc_version, l.runsc_platform, l.runsc_rootless,
                               inv.runtime_dir.empty() ? "/tmp" : inv.runtime_dir};
    }
    if (microvm) {
      // The same plan, applied again by the guest's init; no broker and no
      // DNS inside: the guest has no network device, and egress, if any, is
      // the proxy variables' alone, carried over the VM's port.
      plan.backend = Backend::kMicrovm;
      plan.network.broker = false;
      plan.network.dns_address.clear();
      // max_processes: a pids cgroup inside the guest (the guest's init makes it).
      plan.limits.pids_max = policy.resources.max_processes;
      plan.limits.nproc.reset();
      const LadderCaps& l = host.ladder;
      MicrovmPlan vm;
      vm.qemu = l.qemu;
      vm.virtiofsd = l.virtiofsd;
      vm.kernel = l.guest_kernel;
      vm.initramfs = l.guest_image;
      vm.accel = l.accel();
      // From the policy itself: the VM is the limit, whatever this host's
      // cgroups (which do not hold the VM) allow.
      const auto& res = policy.resources;
      vm.memory_mib = res.memory_limit_bytes ? std::max<std::uint64_t>(*res.memory_limit_bytes >> 20, 64) : 1024;
      vm.vcpus = res.cpu.limit ? static_cast<unsigned>(std::max(1.0, std::ceil(*res.cpu.limit))) : l.cpus;
      vm.rootless = host.uid != 0;
      // Without root the helpers' namespace puts a tmpfs over /run (for
      // virtiofsd's pid file): the run's sockets go below /tmp then.
      vm.state_parent = inv.runtime_dir.empty() || vm.rootless ? "/tmp" : inv.runtime_dir;
      plan.microvm = vm;
    }
  }

  if (Confines(policy)) PlanEscalation(policy, inv, &plan);
  // A path below an on_violation.max_grant tree that the sandbox does not
  // mount: a grant may open it (AttachOffers drops those that do not exist
  // on the host, or lie in a tree the sandbox mounts: plain missing files).
  if (plan.escalation.offers) {
    std::vector<std::string> trees = plan.escalation.filesystem_read;
    trees.insert(trees.end(), plan.escalation.filesystem_write.begin(), plan.escalation.filesystem_write.end());
    for (const auto& tree : trees) {
      if (!tree.empty() && tree[0] == '/' && tree != "/") {
        out.denial_signatures.push_back(PathSignature(tree, "", kNotMountedReason));
      }
    }
  }

  out.runner_failure_rules.push_back(
      {"^agentbox: sandbox error \\[" + inv.nonce + "\\] stage=([a-z_-]+)",
       "the sandbox runner failed before or while starting the command: infrastructure, not the "
       "command"});
  if (inv.wrapped_command) {
    out.argv = {inv.self_exe, "__exec", "--"};
    out.argv.insert(out.argv.end(), argv.begin(), argv.end());
    out.env.emplace_back(kPlanEnv, PlanToJson(plan));
  }
  return out;
}

}  // namespace

}  // namespace agentbox
