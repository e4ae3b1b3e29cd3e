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
#include "linux/compat.h"
#include "linux/fd.h"

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

void ProbeCgroups(HostCaps* caps) {
  CgroupCaps& cg = caps->cgroups;
  std::string mounts;
  ReadSmallFile("/proc/self/mountinfo", &mounts);
  std::istringstream lines(mounts);
  std::string line;
  std::string v2_mountpoint;
  std::map<std::string, std::string> v1_mounts;  // controller -> mountpoint
  while (std::getline(lines, line)) {
    // "... mountpoint ... - fstype source superopts"
    auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream pre(line.substr(0, dash));
    std::string id, parent, devno, root, mountpoint;
    pre >> id >> parent >> devno >> root >> mountpoint;
    std::istringstream post(line.substr(dash + 3));
    std::string fstype, source, opts;
    post >> fstype >> source >> opts;
    if (fstype == "cgroup2") {
      cg.v2_mounted = true;
      if (v2_mountpoint.empty()) v2_mountpoint = mountpoint;
    } else if (fstype == "cgroup") {
      for (const char* c : {"memory", "pids", "cpu", "cpuacct", "cpuset", "blkio", "freezer"}) {
        std::string opt = std::string(",") + opts + ",";
        if (opt.find(std::string(",") + c + ",") != std::string::npos) {
          cg.v1_controllers.push_back(c);
          v1_mounts[c] = mountpoint;
        }
      }
    }
  }
  std::string self;
  ReadSmallFile("/proc/self/cgroup", &self);
  std::istringstream cl(self);
  // "N:controllers:/path" per hierarchy; "0::/path" for v2.
  std::vector<std::string> writable_v1;
  while (std::getline(cl, line)) {
    auto c1 = line.find(':');
    auto c2 = line.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) continue;
    std::string controllers = line.substr(c1 + 1, c2 - c1 - 1);
    std::string rel = line.substr(c2 + 1);
    if (controllers.empty() && !v2_mountpoint.empty()) {
      cg.v2_own_path = v2_mountpoint + rel;
      continue;
    }
    std::istringstream names(controllers);
    std::string name;
    while (std::getline(names, name, ',')) {
      auto it = v1_mounts.find(name);
      if (it != v1_mounts.end() && access((it->second + rel).c_str(), W_OK) == 0) writable_v1.push_back(name);
    }
  }
  cg.v1_writable = writable_v1;
  if (!cg.v2_own_path.empty() && access(cg.v2_own_path.c_str(), W_OK) == 0) {
    cg.can_create_children = true;
  } else if (!writable_v1.empty()) {
    cg.can_create_children = true;
  } else if (!cg.v2_mounted && cg.v1_controllers.empty()) {
    cg.reason = "no cgroup filesystem mounted";
  } else {
    cg.reason = "no writable cgroup for this user (no delegation)";
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
    ProbeCgroups(&caps);
  }
  return caps;
}

}  // namespace agentbox
