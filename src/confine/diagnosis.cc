// Diagnose(): the probe's raw facts turned into causes and fixes; and the
// PATH directories a plan leaves out. No syscalls here: every rule reads
// HostCaps or the plan only.
#include "agentbox/diagnosis.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "confine/layers.h"
#include "confine/paths.h"

namespace agentbox {
namespace {

// "EPERM (Operation not permitted)"
std::string ErrnoText(int err) {
  const char* name = strerrorname_np(err);
  return std::string(name ? name : std::to_string(err).c_str()) + " (" + strerror(err) + ")";
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

constexpr const char* kSysctlFile = "/etc/sysctl.d/90-agentbox-userns.conf";

std::string SysctlFix(const std::string& key, const std::string& value) {
  return "sudo sysctl -w " + key + "=" + value + " && echo '" + key + " = " + value + "' | sudo tee " +
         kSysctlFile + " (the file keeps it across reboots)";
}

void UserNamespaces(const HostCaps& h, std::vector<Diagnosis>* out) {
  const std::string facet = "user-namespaces";
  if (!h.userns_in_kernel) {
    out->push_back({facet, "kernel-no-userns", "/proc/self/ns/user is absent: the kernel is built without CONFIG_USER_NS",
                    "boot a kernel with CONFIG_USER_NS=y (every mainstream distribution kernel has it); until then "
                    "agentbox uses the landlock-only backend"});
  }
  if (h.max_user_namespaces == 0) {
    out->push_back({facet, "max-user-namespaces-zero", "user.max_user_namespaces is 0: no user namespace may be created",
                    SysctlFix("user.max_user_namespaces", "15000")});
  }
  if (h.unprivileged_userns_clone == 0 && !h.is_root()) {
    out->push_back({facet, "unprivileged-userns-clone-off",
                    "kernel.unprivileged_userns_clone is 0: only root may create user namespaces",
                    SysctlFix("kernel.unprivileged_userns_clone", "1")});
  }
  // A capability used in a new namespace (userns_caps_errno 0) means
  // agentbox's profile is loaded: the restriction does not apply to it.
  if (h.apparmor_restrict_userns == 1 && !h.is_root() && h.userns_caps_errno != 0) {
    out->push_back(
        {facet, "apparmor-userns-restricted",
         "kernel.apparmor_restrict_unprivileged_userns is 1: AppArmor lets an unconfined program create a user "
         "namespace but gives it no capabilities in it (Ubuntu 23.10 and later)",
         std::string("install the AppArmor profile that grants agentbox `userns` (") + kAppArmorProfileSource +
             " in the source tree, share/agentbox/apparmor/agentbox where agentbox is installed): sudo "
             "scripts/install-apparmor.sh (copies it to " + kAppArmorProfileInstalled + " and loads it), or by hand: "
             "sudo install -m 0644 " + kAppArmorProfileSource + " " + kAppArmorProfileInstalled +
             " && sudo apparmor_parser -r " +
             kAppArmorProfileInstalled + " (the profile names /usr/bin/agentbox and /usr/local/bin/agentbox; edit "
             "the path for another location); the system-wide alternative, sudo sysctl -w "
             "kernel.apparmor_restrict_unprivileged_userns=0, lifts the restriction for every program"});
  }
  if (h.unshare_errno > 0) {
    const std::string seen = "unshare(CLONE_NEWUSER|CLONE_NEWNS) in a throw-away child failed with " +
                             ErrnoText(h.unshare_errno);
    const bool filtered = h.seccomp_mode == 2 && (h.unshare_errno == EPERM || h.unshare_errno == ENOSYS);
    if (filtered) {
      out->push_back(
          {facet, "seccomp-refuses-unshare",
           seen + ", and a seccomp filter is on this process (Seccomp: 2 in /proc/self/status): a container "
                  "runtime's profile refuses namespace creation (Docker's default allows unshare and clone with "
                  "namespace flags only with CAP_SYS_ADMIN)",
           "run the container with a seccomp profile that allows unshare, clone and clone3 with namespace flags "
           "without CAP_SYS_ADMIN: Podman's default does (docker run --security-opt "
           "seccomp=/usr/share/containers/seccomp.json ..., from Debian's golang-github-containers-common); "
           "never --privileged. Until then agentbox uses the landlock-only backend (run with --require partial)"});
    } else if (h.unshare_errno == ENOSPC) {
      out->push_back({facet, "user-namespace-limit-reached",
                      seen + ": the user.max_user_namespaces count is used up",
                      SysctlFix("user.max_user_namespaces", "15000")});
    } else if (h.unshare_errno == EUSERS) {
      out->push_back({facet, "user-namespace-nesting-too-deep",
                      seen + ": 32 nested user namespaces is the kernel's limit",
                      "run agentbox fewer namespace levels deep (outside the nested sandboxes)"});
    } else if (h.unshare_errno != EINVAL || h.userns_in_kernel) {
      out->push_back({facet, "unshare-refused", seen,
                      "find what refuses it: the sysctls under /proc/sys/user and /proc/sys/kernel, an LSM label "
                      "(/proc/self/attr/current), a seccomp filter (Seccomp: in /proc/self/status)"});
    }
  }
  if (!h.setgroups_file && !h.is_root()) {
    out->push_back({facet, "no-setgroups",
                    "/proc/self/setgroups is absent (Linux < 3.19): an unprivileged process cannot write its "
                    "gid_map, so it cannot map itself in a user namespace",
                    "boot Linux >= 3.19 (agentbox needs >= 5.12 for its mount API anyway)"});
  }
  const bool explained = !out->empty();
  if (!h.user_namespaces && !explained) {
    out->push_back({facet, "userns-unavailable", h.userns_reason.empty() ? "user namespaces unavailable" : h.userns_reason,
                    "see the detail; agentbox uses the landlock-only backend meanwhile"});
  }
}

void Proc(const HostCaps& h, std::vector<Diagnosis>* out) {
  if (!h.user_namespaces) return;  // nothing to mount it in: the cause above comes first
  const bool refused = h.proc_mount_errno > 0 || (h.proc_mount_errno < 0 && !h.proc_fully_visible);
  if (!refused) return;
  std::string detail =
      h.proc_mount_errno > 0
          ? "mount(\"proc\") in a new user, mount and pid namespace failed with " + ErrnoText(h.proc_mount_errno)
          : std::string("no proc mount of this process is fully visible");
  detail += h.proc_overmounts.empty() ? std::string(": ")
                                      : "; mounted over parts of /proc: " + Join(h.proc_overmounts) + ": ";
  detail += "the kernel lets a user namespace mount a fresh proc only when an existing one hides nothing "
            "(container runtimes mask /proc/kcore, /proc/keys, /proc/sys, ...)";
  out->push_back({"proc", "proc-overmounted", detail,
                  "let the container's /proc be fully visible: podman run --security-opt unmask=ALL ... (or "
                  "unmask=/proc/*), docker run --security-opt systempaths=unconfined ...; the sandbox's own proc "
                  "shows only its pid namespace. agentbox does not bind the host's /proc instead (it would show "
                  "every process of the container); it uses the landlock-only backend until then"});
}

void Network(const HostCaps& h, std::vector<Diagnosis>* out) {
  if (h.loopback_errno <= 0) return;
  out->push_back({"network", "netlink-lo-refused",
                  "bringing lo up (ioctl SIOCSIFFLAGS) in a new user and network namespace failed with " +
                      ErrnoText(h.loopback_errno) +
                      ": the namespaces backend brings lo up in every sandbox, so a run fails at that step",
                  "allow interface configuration inside new network namespaces in the profile that confines this "
                  "process: ioctl(SIOCSIFFLAGS) and netlink RTM_NEWLINK (see Seccomp: in /proc/self/status and "
                  "the LSM label in /proc/self/attr/current); Docker's and Podman's default profiles allow both"});
}

void Landlock(const HostCaps& h, std::vector<Diagnosis>* out) {
  const std::string facet = "landlock";
  if (h.landlock_abi > 0) {
    if (h.landlock_abi < kMinLandlockAbi) {
      out->push_back({facet, "landlock-abi-too-old",
                      "Landlock ABI " + std::to_string(h.landlock_abi) + "; agentbox needs ABI >= " +
                          std::to_string(kMinLandlockAbi) + " (the refer right, Linux 5.19)",
                      "boot Linux >= 5.19 (6.7 or later for Landlock's network rules)"});
    }
    return;
  }
  const bool lsm_known = !h.lsm.empty();
  const bool listed = h.lsm.find("landlock") != std::string::npos;
  const std::string seen = "landlock_create_ruleset(VERSION) failed with " + ErrnoText(h.landlock_errno) +
                           (lsm_known ? "; active LSMs: " + h.lsm.substr(0, h.lsm.find_last_not_of('\n') + 1)
                                      : std::string("; /sys/kernel/security/lsm unreadable"));
  if (h.landlock_errno == EOPNOTSUPP || (lsm_known && !listed && h.landlock_errno != ENOSYS)) {
    out->push_back({facet, "landlock-disabled", seen + ": Landlock is built in but not enabled at boot",
                    "add landlock to the LSM list on the kernel command line: in /etc/default/grub set "
                    "GRUB_CMDLINE_LINUX=\"... lsm=landlock,<the list /sys/kernel/security/lsm shows now>\", then "
                    "sudo update-grub and reboot"});
  } else if (h.seccomp_mode == 2 && (h.landlock_errno == ENOSYS || h.landlock_errno == EPERM)) {
    out->push_back({facet, "seccomp-refuses-landlock",
                    seen + ", and a seccomp filter is on this process: an old container profile that does not "
                           "know the landlock_* syscalls",
                    "use a container runtime whose default profile allows landlock_create_ruleset, "
                    "landlock_add_rule and landlock_restrict_self (current Docker and Podman defaults do), or pass "
                    "such a profile with --security-opt seccomp=PROFILE"});
  } else {
    out->push_back({facet, "no-landlock", seen + ": the kernel has no Landlock",
                    "boot Linux >= 5.19 built with CONFIG_SECURITY_LANDLOCK=y and landlock in CONFIG_LSM"});
  }
}

void Seccomp(const HostCaps& h, std::vector<Diagnosis>* out) {
  if (h.seccomp_filter) return;
  out->push_back({"seccomp", "no-seccomp",
                  "the kernel does not offer seccomp filters (PR_GET_SECCOMP or "
                  "/proc/sys/kernel/seccomp/actions_avail missing)",
                  "boot a kernel built with CONFIG_SECCOMP=y and CONFIG_SECCOMP_FILTER=y"});
}

void Cgroups(const HostCaps& h, std::vector<Diagnosis>* out) {
  if (!h.cgroupfs_read_only) return;
  out->push_back({"cgroups", "cgroupfs-read-only",
                  "/sys/fs/cgroup is mounted read-only (a container's default): no cgroup of agentbox's own, so "
                  "memory and CPU limits asked of it go unenforced (listed in enforcement.missing)",
                  "set the limits on the container itself (docker run --memory 2g --pids-limit 512 --cpus 2 ..., "
                  "the same flags for podman), or run agentbox where it has a delegated, writable cgroup"});
}

void Processes(const HostCaps& h, std::vector<Diagnosis>* out) {
  if (h.sethostname_errno <= 0) return;
  out->push_back({"processes", "seccomp-refuses-sethostname",
                  "sethostname in a new user and uts namespace failed with " + ErrnoText(h.sethostname_errno) +
                      (h.seccomp_mode == 2 ? " under a seccomp filter (Podman's and Docker's default profiles "
                                             "refuse it without CAP_SYS_ADMIN)"
                                           : std::string()) +
                      ": the sandbox keeps its own uts namespace, with the container's hostname in it",
                  "nothing needs doing (the report notes it); to name the sandbox's host `agentbox`, allow "
                  "sethostname in the container's seccomp profile"});
}

}  // namespace

std::string DiagnosisText(const std::vector<Diagnosis>& diagnosis) {
  std::string out = "diagnosis: ";
  out += diagnosis.empty() ? "nothing stands in the way\n" : "what stands in the way, and how to lift it\n";
  for (const auto& d : diagnosis) {
    out += "  " + d.facet + "\n    cause: " + d.cause + ": " + d.detail + "\n    fix: " + d.fix + "\n";
  }
  return out;
}

std::vector<Diagnosis> Diagnose(const HostCaps& host) {
  std::vector<Diagnosis> out;
  UserNamespaces(host, &out);
  Proc(host, &out);
  Network(host, &out);
  Processes(host, &out);
  Landlock(host, &out);
  Seccomp(host, &out);
  Cgroups(host, &out);
  return out;
}

std::string PathInside(const EnvRules& env, const std::string& host_path) {
  for (const auto& [k, v] : env.set) {
    if (k == "PATH") return v;
  }
  const bool passed = env.pass_all || std::find(env.pass.begin(), env.pass.end(), "PATH") != env.pass.end();
  return passed ? host_path : "";
}

namespace {

// Does the plan show the host directory `dir` at its own path?
bool Shown(const Plan& plan, const std::string& dir) {
  if (!plan.confined) return true;
  if (plan.backend == Backend::kLandlockOnly) {
    if (plan.landlock.abi == 0) return true;  // no fence: host paths as they are
    return std::any_of(plan.landlock.rules.begin(), plan.landlock.rules.end(),
                       [&](const LandlockRule& r) { return paths::IsWithin(dir, r.path); });
  }
  // The deepest mount over it decides: a bind shows the host's tree, a
  // tmpfs (the new root, the private HOME) hides it.
  const MountOp* over = nullptr;
  for (const auto& m : plan.mounts) {
    if (paths::IsWithin(dir, m.target) && (!over || paths::Depth(m.target) >= paths::Depth(over->target))) {
      over = &m;
    }
  }
  if (!over) return false;
  if (over->kind == MountKind::kMask) return true;  // denied on purpose: not for a hint to undo
  return over->kind != MountKind::kTmpfs;
}

// The read_only entry that would bind `dir` (below `home`), in `~/` form.
std::string EntryFor(const std::string& dir, const std::string& home) {
  const std::string rel = dir.substr(home == "/" ? 1 : home.size() + 1);
  const std::string top = rel.substr(0, rel.find('/'));
  return "~/" + (top == ".local" ? rel : top);
}

}  // namespace

HomePathDirs FindHomePathDirs(const Plan& plan, const std::vector<std::string>& dirs, const std::string& home,
                              const std::vector<std::string>& read_only_now) {
  HomePathDirs out;
  if (home.empty() || home == "/") return out;
  std::vector<std::string> added;
  for (const auto& d : dirs) {
    if (d == home || !paths::IsWithin(d, home) || Shown(plan, d)) continue;
    if (std::find(out.not_mounted.begin(), out.not_mounted.end(), d) != out.not_mounted.end()) continue;
    out.not_mounted.push_back(d);
    const std::string entry = EntryFor(d, home);
    if (std::find(added.begin(), added.end(), entry) == added.end()) added.push_back(entry);
  }
  if (out.not_mounted.empty()) return out;
  out.read_only = read_only_now;
  for (auto& e : added) {
    if (std::find(out.read_only.begin(), out.read_only.end(), e) == out.read_only.end()) out.read_only.push_back(e);
  }
  return out;
}

std::string HomePathDirsText(const HomePathDirs& found, const std::string& prefix) {
  if (found.not_mounted.empty()) return "";
  std::string list;
  for (const auto& e : found.read_only) list += (list.empty() ? "" : ", ") + e;
  return prefix + "PATH directories under HOME are not mounted inside (the sandbox's HOME is private), so commands " +
         "there are not found: " + Join(found.not_mounted) + "\n" + prefix +
         "  to use them, bind them read-only in the policy file: filesystem.read_only: [" + list + "]\n" + prefix +
         "  (everything under an entry is readable inside: list a token file there under filesystem.deny)\n";
}

}  // namespace agentbox
