// What this host can enforce, probed once (DESIGN §1).
//
// HostCaps is plain data so that planning can be tested against any host: the
// tests build fake ones. ProbeHost() is the only place that asks the kernel.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace agentbox {

struct CgroupCaps {
  bool v2_mounted = false;
  std::string v2_own_path;               // our cgroup directory in the v2 hierarchy, if any
  std::vector<std::string> v1_controllers; // mounted v1 controllers (memory, pids, cpu, ...)
  std::vector<std::string> v1_writable;    // those whose cgroup of ours we may create children in
  bool can_create_children = false;      // a writable cgroup directory for this process exists
  std::string reason;                    // why not, when it cannot
  // Controllers a child cgroup of ours can be given, each with where from:
  // "memory" -> "v2" | "v1". Limits whose controller is absent are not enforced.
  std::vector<std::pair<std::string, std::string>> delegated;
  bool probed = false;                   // false: not looked at (a quick probe, no limits asked)
  // Directories that `agentbox setup-delegation` handed to this user and
  // that stand for our own unwritable cgroup: controller ("v2" for the v2
  // hierarchy) -> directory. And why a delegation on record is not used.
  std::vector<std::pair<std::string, std::string>> delegation;
  std::vector<std::string> delegation_notes;

  // The delegated directory a run's `controller` cgroup goes under, or null.
  const char* DelegatedDir(const std::string& controller) const {
    const char* where = Where(controller);
    if (!where) return nullptr;
    const std::string key = std::string(where) == "v2" ? "v2" : controller;
    for (const auto& [c, d] : delegation) {
      if (c == key) return d.c_str();
    }
    return nullptr;
  }

  const char* Where(const std::string& controller) const {
    for (const auto& [c, w] : delegated) {
      if (c == controller) return w.c_str();
    }
    return nullptr;
  }
};

// The isolation ladder's rungs above `os` (sandbox.isolation container and
// microvm): the programs and devices that give a process a kernel other
// than this host's. Probed only when a policy asks for one, and by `check`.
struct LadderCaps {
  bool probed = false;
  std::string runsc;            // gVisor's runsc (Debian package runsc); "" when not installed
  std::string runsc_version;    // "0.0~20221219.0", from `runsc --version`
  std::string runsc_platform = "ptrace";  // the platform agentbox runs it on
  bool runsc_rootless = false;  // not root: runs with --rootless (the sandbox in a user namespace of ours)
  std::string runsc_why;        // why runsc cannot run a sandbox here ("" = it can, as far as probed)
  bool runsc_tried = false;     // kDeep: a real sandbox was started (runsc do /bin/true)
  std::string qemu;             // qemu-system-x86_64; "" when not installed
  bool kvm = false;             // /dev/kvm opens read-write for this user
  std::string kvm_why;          // why not ("no /dev/kvm", "permission denied: /dev/kvm is 0600 root")
  std::string guest_kernel;     // a Debian kernel package's /boot/vmlinuz-*; "" none
  std::string virtiofsd;        // QEMU's virtiofsd (the guest's files); "" when not installed
  std::string guest_image;      // agentbox's initramfs for guest_kernel's release; "" when not built
  std::string guest_image_why;  // why there is none ("" = there is)
  std::string microvm_why;      // why a microVM cannot run here ("" = it can, as far as probed)
  unsigned cpus = 1;            // online CPUs: a VM's vCPUs without a cpu.limit
  std::string accel() const { return kvm ? "kvm" : "tcg"; }
};

struct HostCaps {
  // Identity of the invoking process.
  uid_t uid = 0;
  gid_t gid = 0;
  std::string kernel_release;

  // Namespaces. `user_namespaces` is false when the kernel or a sysctl refuses
  // them to this user; `userns_reason` says which.
  bool user_namespaces = false;
  bool userns_restricted = false;         // e.g. AppArmor's unprivileged_userns restriction
  std::string userns_reason;
  bool mount_ns = false, pid_ns = false, net_ns = false, ipc_ns = false, uts_ns = false,
       cgroup_ns = false;

  // The raw facts behind the verdicts above, for the doctor (agentbox/diagnosis.h):
  // each says what was seen, not what it means.
  bool userns_in_kernel = true;           // /proc/self/ns/user exists (CONFIG_USER_NS)
  long max_user_namespaces = -1;          // user.max_user_namespaces; -1: no such sysctl
  long unprivileged_userns_clone = -1;    // kernel.unprivileged_userns_clone (Debian/Ubuntu); -1: absent
  long apparmor_restrict_userns = -1;     // kernel.apparmor_restrict_unprivileged_userns; -1: absent
  int userns_caps_errno = -1;             // where AppArmor restricts user namespaces: a mount in a new
                                          // one (needs its CAP_SYS_ADMIN); 0: allowed (agentbox's profile
                                          // is loaded); -1 not tried
  bool setgroups_file = true;             // /proc/self/setgroups exists (needed to map a gid unprivileged)
  int seccomp_mode = 0;                   // "Seccomp:" of /proc/self/status: 2 = a filter is on us
                                          // already (a container runtime's, typically)
  int unshare_errno = -1;                 // a real unshare(CLONE_NEWUSER|CLONE_NEWNS) in a throw-away
                                          // child: 0 it worked, else its errno; -1 not tried
  // A user namespace may mount a fresh proc only if some proc mount is "fully
  // visible": nothing mounted over a file or non-empty directory in it.
  // Containers mask /proc/kcore, /proc/keys, ... with binds, which hides it.
  bool proc_fully_visible = true;
  std::vector<std::string> proc_overmounts;  // what hides parts of /proc (mount points)
  int sethostname_errno = -1;             // sethostname in a new user+uts ns, tried when a seccomp
                                          // filter is on us (containers' profiles refuse it): 0 ok; -1 not tried
  int proc_mount_errno = -1;              // kDeep: mount("proc") in a new user+mnt+pid ns; 0 ok; -1 not tried
  int loopback_errno = -1;                // kDeep: SIOCSIFFLAGS up on lo in a new user+net ns; 0 ok; -1 not tried
  int landlock_errno = 0;                 // errno of the Landlock ABI query when it failed
  std::string lsm;                        // /sys/kernel/security/lsm; "" when unreadable
  bool cgroupfs_read_only = false;        // /sys/fs/cgroup (or the cgroup2 mount) is mounted read-only

  int landlock_abi = 0;                   // 0: no Landlock
  bool seccomp_filter = false;
  bool no_new_privs = false;
  bool new_mount_api = false;             // open_tree / move_mount / mount_setattr
  bool overlayfs = false;
  bool pidfd = false;
  CgroupCaps cgroups;
  LadderCaps ladder;

  bool is_root() const { return uid == 0; }
};

enum class ProbeDepth {
  kQuick,  // namespaces, Landlock, seccomp, pidfd: what every run needs, cheaply
  kDeep,   // also cgroups, overlayfs, and a real user namespace in a throw-away
           // child: for `check`
};

HostCaps ProbeHost(ProbeDepth depth);

// The cgroup part of the probe alone (kDeep includes it): a few small reads
// of /proc/self and cgroupfs. Callers of a quick probe add it when the
// policy asks for cgroup-backed limits.
CgroupCaps ProbeCgroupCaps();

// What a run of `policy` needs to know: the quick probe, plus cgroups when
// the policy asks for a limit that needs one.
// The ladder's programs and devices (kDeep: also a real gVisor sandbox).
LadderCaps ProbeLadder(ProbeDepth depth);

struct Policy;
HostCaps ProbeHostFor(const Policy& policy);

}  // namespace agentbox
