// ProbeHost: the only place that asks the kernel what it can do.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
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
#include "linux/namespaces.h"

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

// Runs `body` in a forked child and returns what it returned: 0 for success,
// else an errno. The parent may have threads (the daemon probes too), so a
// body makes syscalls only: nothing that allocates or takes a lock. Whatever
// namespaces the child made die with it. A child killed by a signal (a
// seccomp profile whose action is to kill) counts as EPERM: the kernel
// refused.
int InThrowAwayChild(int (*body)()) {
  const pid_t pid = fork();
  if (pid < 0) return errno;
  if (pid == 0) _exit(body() & 0xff);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return ECHILD;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : EPERM;
}

int TryUnshareUserMount() { return unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0 ? 0 : errno; }

// Under AppArmor's restriction an unconfined program may create a user
// namespace but holds no capability in it; a program whose profile grants
// `userns` (packaging/apparmor/agentbox) holds them. A mount needs one.
int TryCapabilityInUserNamespace() {
  if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return errno;
  return mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 ? 0 : errno;
}

// What the namespaces backend's runner does to get its /proc: a new user,
// mount and pid namespace, then a fresh proc mounted by the pid namespace's
// first process. The kernel refuses it (EPERM) unless some proc mount of ours
// is fully visible (fs/namespace.c mount_too_revealing).
int TryMountFreshProc() {
  if (unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID) != 0) return errno;
  // No id maps: the mount does not need them, and writing them would
  // allocate, which a child forked from a threaded daemon must not.
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return errno;
  const pid_t init = fork();
  if (init < 0) return errno;
  if (init == 0) {
    _exit(mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) == 0 ? 0 : errno & 0xff);
  }
  int status = 0;
  if (waitpid(init, &status, 0) != init) return ECHILD;
  return WIFEXITED(status) ? WEXITSTATUS(status) : EPERM;
}

// What the runner does in its uts namespace: name the host "agentbox".
int TrySetHostname() {
  if (unshare(CLONE_NEWUSER | CLONE_NEWUTS) != 0) return errno;
  return sethostname("agentbox", 8) == 0 ? 0 : errno;
}

// What the runner does for a network namespace: `lo` up, by ioctl. Only
// the deep probe (`check`, single-threaded) runs it: an error Status allocates.
int TryLoopbackUp() {
  if (unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0) return errno;
  const Status s = linux::BringUpLoopback();
  return s.ok() ? 0 : (s.err() != 0 ? s.err() : EPERM);
}

void ReadSeccompMode(HostCaps* caps) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Seccomp:", 0) == 0) {
      caps->seccomp_mode = std::atoi(line.c_str() + 8);
      return;
    }
  }
}

struct MountEntry {
  std::string id, parent, point, fstype, options;
};

std::vector<MountEntry> ReadMountInfo() {
  std::vector<MountEntry> out;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    MountEntry m;
    std::string dev, root, opts, field, source, super;
    f >> m.id >> m.parent >> dev >> root >> m.point >> m.options;
    while (f >> field && field != "-") {
    }
    f >> m.fstype >> source >> super;
    out.push_back(std::move(m));
  }
  return out;
}

// Whether some proc mount is fully visible, and what hides the others. The
// kernel lets a submount stand only on an empty directory: the mount points
// procfs keeps for binfmt_misc and nfsd are the ones it has. A guess that
// the probe then checks with a real mount.
void ProbeProcVisibility(HostCaps* caps, const std::vector<MountEntry>& mounts) {
  bool any_visible = false;
  for (const auto& proc : mounts) {
    if (proc.fstype != "proc") continue;
    bool visible = true;
    for (const auto& child : mounts) {
      if (child.parent != proc.id || child.point == "/proc/sys/fs/binfmt_misc" || child.point == "/proc/fs/nfsd") {
        continue;
      }
      visible = false;
      caps->proc_overmounts.push_back(child.point);
    }
    any_visible = any_visible || visible;
  }
  caps->proc_fully_visible = any_visible;
}

// Every cgroup hierarchy mounted read-only (a container's default). The
// tmpfs systemd puts at /sys/fs/cgroup on v1 hosts is read-only too, with
// writable hierarchies below it: only the cgroup mounts count.
bool ReadOnlyCgroupfs(const std::vector<MountEntry>& mounts) {
  bool any = false;
  for (const auto& m : mounts) {
    if (m.fstype != "cgroup" && m.fstype != "cgroup2") continue;
    any = true;
    if (m.options != "ro" && m.options.rfind("ro,", 0) != 0) return false;
  }
  return any;
}

void ProbeUserNamespaces(HostCaps* caps, ProbeDepth depth) {
  caps->max_user_namespaces = ReadSysctl("/proc/sys/user/max_user_namespaces");
  caps->unprivileged_userns_clone = ReadSysctl("/proc/sys/kernel/unprivileged_userns_clone");
  caps->apparmor_restrict_userns = ReadSysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns");
  caps->setgroups_file = Exists("/proc/self/setgroups");
  ReadSeccompMode(caps);
  caps->userns_in_kernel = Exists("/proc/self/ns/user");
  caps->user_namespaces = caps->userns_in_kernel;
  if (!caps->user_namespaces) {
    caps->userns_reason = "kernel built without user namespaces";
    return;
  }
  if (caps->max_user_namespaces == 0) {
    caps->user_namespaces = false;
    caps->userns_reason = "user.max_user_namespaces is 0";
    return;
  }
  if (caps->unprivileged_userns_clone == 0 && caps->uid != 0) {
    caps->user_namespaces = false;
    caps->userns_restricted = true;
    caps->userns_reason = "kernel.unprivileged_userns_clone is 0";
    return;
  }
  if (caps->apparmor_restrict_userns == 1 && caps->uid != 0) {
    // Creation succeeds but the namespace gets no capabilities, unless
    // agentbox's AppArmor profile is loaded: ask the kernel which.
    caps->userns_caps_errno = InThrowAwayChild(TryCapabilityInUserNamespace);
    if (caps->userns_caps_errno != 0) {
      caps->userns_restricted = true;
      caps->user_namespaces = false;
      caps->userns_reason = "kernel.apparmor_restrict_unprivileged_userns is 1";
      return;
    }
  }
  // No sysctl shows a seccomp filter's verdict (a container runtime's default
  // profile refuses unshare and namespace flags to clone without
  // CAP_SYS_ADMIN): when one is on us, even a quick probe asks the kernel.
  if (depth == ProbeDepth::kDeep || caps->seccomp_mode == 2) {
    caps->unshare_errno = InThrowAwayChild(TryUnshareUserMount);
    if (caps->unshare_errno != 0) {
      caps->user_namespaces = false;
      caps->userns_reason = "unshare(CLONE_NEWUSER|CLONE_NEWNS) failed in a test child: " +
                            std::string(strerror(caps->unshare_errno)) +
                            (caps->seccomp_mode == 2 ? " (a seccomp filter is on this process)" : "");
      return;
    }
    caps->sethostname_errno = InThrowAwayChild(TrySetHostname);
  }
  if (!caps->setgroups_file && caps->uid != 0) {
    caps->user_namespaces = false;
    caps->userns_reason = "no /proc/self/setgroups: an unprivileged process cannot map its gid (Linux < 3.19)";
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
  const std::vector<MountEntry> mounts = ReadMountInfo();
  ProbeProcVisibility(&caps, mounts);
  caps.cgroupfs_read_only = ReadOnlyCgroupfs(mounts);
  ReadSmallFile("/sys/kernel/security/lsm", &caps.lsm);
  // A run pays for the real proc mount only when mountinfo suggests it fails:
  // the kernel has the last word.
  if (caps.user_namespaces && (depth == ProbeDepth::kDeep || !caps.proc_fully_visible)) {
    caps.proc_mount_errno = InThrowAwayChild(TryMountFreshProc);
  }
  if (depth == ProbeDepth::kDeep && caps.user_namespaces) caps.loopback_errno = InThrowAwayChild(TryLoopbackUp);
  caps.mount_ns = Exists("/proc/self/ns/mnt");
  caps.pid_ns = Exists("/proc/self/ns/pid");
  caps.net_ns = Exists("/proc/self/ns/net");
  caps.ipc_ns = Exists("/proc/self/ns/ipc");
  caps.uts_ns = Exists("/proc/self/ns/uts");
  caps.cgroup_ns = Exists("/proc/self/ns/cgroup");

  errno = 0;
  int abi = linux::LandlockAbiVersion();
  caps.landlock_abi = abi > 0 ? abi : 0;
  if (abi <= 0) caps.landlock_errno = errno;
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
    caps.ladder = ProbeLadder(ProbeDepth::kDeep);
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
  const Isolation iso = policy.sandbox.isolation;
  if (iso == Isolation::kContainer || iso == Isolation::kMicrovm) host.ladder = ProbeLadder(ProbeDepth::kQuick);
  return host;
}

}  // namespace agentbox
