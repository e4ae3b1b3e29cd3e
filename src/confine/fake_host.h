// Fake hosts and invocations for planning tests: no kernel involved.
#pragma once

#include <algorithm>
#include <string>

#include "agentbox/confine.h"
#include "agentbox/host_caps.h"

namespace agentbox::testing {

// An unprivileged user (uid 1000) on a host with every facility, or with
// user namespaces refused by a sysctl.
inline HostCaps FakeHost(bool userns = true, int landlock_abi = 7, bool seccomp = true) {
  HostCaps h;
  h.uid = 1000;
  h.gid = 1000;
  h.user_namespaces = userns;
  h.userns_reason = userns ? "" : "kernel.unprivileged_userns_clone is 0";
  h.mount_ns = h.pid_ns = h.net_ns = h.ipc_ns = h.uts_ns = h.cgroup_ns = userns;
  h.new_mount_api = true;
  h.landlock_abi = landlock_abi;
  h.seccomp_filter = seccomp;
  h.pidfd = true;
  return h;
}

// Workspace /home/u/proj, HOME /home/u, called from `cwd`.
inline Invocation FakeInvocation(const std::string& cwd = "/home/u/proj/src") {
  Invocation inv;
  inv.workspace = "/home/u/proj";
  inv.cwd = cwd;
  inv.home = "/home/u";
  inv.self_exe = "/usr/bin/agentbox";
  inv.nonce = "0123456789abcdef";
  return inv;
}

// The facet of the report named `name`, or nullptr.
inline const FacetReport* FacetNamed(const EnforcementReport& r, const std::string& name) {
  for (const auto& f : r.facets) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// Whether facet `f` (may be nullptr) lists mechanism `m`.
inline bool HasMechanism(const FacetReport* f, const std::string& m) {
  return f && std::find(f->mechanisms.begin(), f->mechanisms.end(), m) != f->mechanisms.end();
}

// The plan's Landlock rule for `path`, or nullptr.
inline const LandlockRule* Rule(const Plan& p, const std::string& path) {
  for (const auto& r : p.landlock.rules) {
    if (r.path == path) return &r;
  }
  return nullptr;
}

}  // namespace agentbox::testing
