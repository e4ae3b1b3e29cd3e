// ProbeHost: the only place that asks the kernel what it can do.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <map>
#include <vector>
#include <sstream>
#include <string>

#include "agentbox/host_caps.h"
#include "agentbox/policy.h"
#include "linux/cgroup_delegation.h"
#include "linux/cgroups.h"
#include "linux/compat.h"
#include "linux/fd.h"
#include "linux/landlock_ruleset.h"

namespace agentbox {
namespace {

bool ReadSmallFile(const char* path, std::string* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

// -1 when the sysctl does not exist.
long ReadSysctl(const char* path) {
  std::string text;
  if (!ReadSmallFile(path, &text)) return -1;
  try {
    return std::stol(text);
  } catch (...) {
    return -1;
  }
}

bool Exists(const char* path) { return access(path, F_OK) == 0; }

void ProbeUserNamespaces(HostCaps* caps, ProbeDepth depth) {
  long max_ns = ReadSysctl("/proc/sys/user/max_user_namespaces");
  long unpriv = ReadSysctl("/proc/sys/kernel/unprivileged_userns_clone");
  long apparmor = ReadSysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns");
  caps->user_namespaces = Exists("/proc/self/ns/user");
  if (!caps->user_namespaces) {
    caps->userns_reason = "kernel built without user namespaces";
    return;
  }
  if (max_ns == 0) {
    caps->user_namespaces = false;
    caps->userns_reason = "user.max_user_namespaces is 0";
    return;
  }
  if (unpriv == 0 && caps->uid != 0) {
    caps->user_namespaces = false;
    caps->userns_restricted = true;
    caps->userns_reason = "kernel.unprivileged_userns_clone is 0";
    return;
  }
  if (apparmor == 1 && caps->uid != 0) {
    // Creation succeeds but the namespace gets no capabilities: not usable.
    caps->userns_restricted = true;
    caps->user_namespaces = false;
    caps->userns_reason = "kernel.apparmor_restrict_unprivileged_userns is 1";
    return;
  }
  if (depth == ProbeDepth::kDeep) {
    // Really create one (and a mount namespace in it) in a throw-away child.
    pid_t pid = fork();
    if (pid == 0) {
      if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) _exit(1);
      _exit(0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
      caps->user_namespaces = false;
      caps->userns_reason = "unshare(CLONE_NEWUSER|CLONE_NEWNS) failed in a test child";
    }
  }
}

}  // namespace

HostCaps ProbeHost(ProbeDepth depth) {
  HostCaps caps;
  caps.uid = getuid();
  caps.gid = getgid();
  struct utsname u {};
  if (uname(&u) == 0) caps.kernel_release = u.release;

  ProbeUserNamespaces(&caps, depth);
  caps.mount_ns = Exists("/proc/self/ns/mnt");
  caps.pid_ns = Exists("/proc/self/ns/pid");
  caps.net_ns = Exists("/proc/self/ns/net");
  caps.ipc_ns = Exists("/proc/self/ns/ipc");
  caps.uts_ns = Exists("/proc/self/ns/uts");
  caps.cgroup_ns = Exists("/proc/self/ns/cgroup");

  int abi = linux::LandlockAbiVersion();
  caps.landlock_abi = abi > 0 ? abi : 0;
  caps.seccomp_filter = prctl(PR_GET_SECCOMP, 0, 0, 0, 0) >= 0 && Exists("/proc/sys/kernel/seccomp/actions_avail");
  caps.no_new_privs = prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) >= 0;

  // The new mount API answers EBADF/EINVAL to a bad fd when present, ENOSYS when not.
  errno = 0;
  linux::MountAttr attr{};
  int r = linux::MountSetattr(-1, "", 0, &attr);
  caps.new_mount_api = !(r < 0 && errno == ENOSYS);

  linux::UniqueFd pidfd(linux::PidfdOpen(getpid()));
  caps.pidfd = pidfd.valid();

  // What no run of this version needs: only `check` pays for it.
  if (depth == ProbeDepth::kDeep) {
    std::string filesystems;
    ReadSmallFile("/proc/filesystems", &filesystems);
    caps.overlayfs = filesystems.find("\toverlay\n") != std::string::npos;
    caps.cgroups = ProbeCgroupCaps();
  }
  return caps;
}

CgroupCaps ProbeCgroupCaps() {
  CgroupCaps cg;
  cg.probed = true;
  linux::CgroupFs fs;
  // With this user's delegation (setup-delegation) where our own cgroup is not writable.
  linux::CgroupLayout layout = linux::DiscoverRunCgroupLayout(fs);
  for (const auto& [c, dir] : layout.delegated) cg.delegation.emplace_back(c, dir);
  cg.delegation_notes = layout.delegation_notes;
  cg.v2_mounted = !layout.v2_dir.empty();
  cg.v2_own_path = layout.v2_dir;
  for (const auto& [c, dir] : layout.v1_dirs) {
    cg.v1_controllers.push_back(c);
    if (access(dir.c_str(), W_OK) == 0) cg.v1_writable.push_back(c);
  }
  const bool v2_writable = cg.v2_mounted && access(layout.v2_dir.c_str(), W_OK) == 0;
  cg.can_create_children = v2_writable || !cg.v1_writable.empty();
  for (const char* c : {"memory", "pids", "cpu"}) {
    switch (linux::ChooseHierarchy(fs, layout, c)) {
      case linux::Hierarchy::kV2: cg.delegated.emplace_back(c, "v2"); break;
      case linux::Hierarchy::kV1: cg.delegated.emplace_back(c, "v1"); break;
      case linux::Hierarchy::kNone: break;
    }
  }
  if (!cg.can_create_children) {
    std::string unused;  // why the delegation on record (if any) is not used
    for (const auto& n : cg.delegation_notes) unused += (unused.empty() ? "" : "; ") + n;
    if (!cg.v2_mounted && cg.v1_controllers.empty()) {
      cg.reason = "no cgroup filesystem mounted";
    } else if (unused.empty()) {
      cg.reason = "no writable cgroup for this user (no delegation: as root, `agentbox setup-delegation --user NAME` "
                  "hands it one; see docs/delegation.md)";
    } else {
      cg.reason = "no writable cgroup for this user (the delegation on record is not used: " + unused + ")";
    }
  } else if (cg.delegated.size() < 3 && !cg.delegation_notes.empty()) {
    std::string unused;
    for (const auto& n : cg.delegation_notes) unused += (unused.empty() ? "" : "; ") + n;
    cg.reason = "the delegation on record is not used for every controller: " + unused;
  } else if (cg.delegated.size() < 3 && v2_writable && !layout.v2_is_root) {
    cg.reason = "our v2 cgroup " + layout.v2_dir +
                " holds processes, so the kernel gives its children no controller it has not "
                "enabled already (run agentbox in a delegated cgroup with them in cgroup.subtree_control)";
  }
  return cg;
}

HostCaps ProbeHostFor(const Policy& policy) {
  HostCaps host = ProbeHost(ProbeDepth::kQuick);
  const ResourcesSpec& r = policy.resources;
  if (r.cpu.requested() || r.memory_limit_bytes || r.memory_guaranteed_bytes || r.max_processes) {
    host.cgroups = ProbeCgroupCaps();
  }
  return host;
}

}  // namespace agentbox
