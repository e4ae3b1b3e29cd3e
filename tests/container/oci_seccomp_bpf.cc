// Compiles an OCI seccomp profile (the JSON Docker and Podman take with
// --security-opt seccomp=FILE) into the BPF program bwrap --seccomp FD
// loads, for a process without capabilities on this architecture: the
// container test's stand-in for a container runtime.
//
//   oci_seccomp_bpf PROFILE.json [--docker-namespace-rules] [--refuse NAME]...
//                   [--refuse-ioctl REQUEST]... > filter.bpf
//
// --refuse NAME answers NAME with ENOSYS, the way a profile older than the
// call does (the landlock_* calls before Docker 20.10.11). --refuse-ioctl
// answers one ioctl request (e.g. 0x8914, SIOCSIFFLAGS) with EPERM.
// --docker-namespace-rules replaces the namespace and mount syscalls'
// entries with what Docker's default profile (moby profiles/seccomp/
// default.json) gives a container without CAP_SYS_ADMIN: clone only without
// CLONE_NEW* flags (mask 0x7E020000), clone3 ENOSYS, unshare, setns, mount,
// pivot_root and the new mount API refused with its default EPERM.
#include <seccomp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

namespace {

using nlohmann::json;

bool HasAny(const json& obj, const char* key) { return obj.is_object() && obj.contains(key) && !obj[key].empty(); }

bool Contains(const json& list, const std::string& v) {
  for (const auto& x : list) {
    if (x.get<std::string>() == v) return true;
  }
  return false;
}

// Whether an entry applies to an amd64 process with no capabilities.
bool Applies(const json& e) {
  if (e.contains("includes")) {
    const json& in = e["includes"];
    if (HasAny(in, "caps")) return false;
    if (HasAny(in, "arches") && !Contains(in["arches"], "amd64")) return false;
  }
  if (e.contains("excludes")) {
    const json& ex = e["excludes"];
    if (HasAny(ex, "arches") && Contains(ex["arches"], "amd64")) return false;
  }
  return true;
}

uint32_t Action(const std::string& name, int errno_ret) {
  if (name == "SCMP_ACT_ALLOW" || name == "SCMP_ACT_LOG") return SCMP_ACT_ALLOW;
  if (name == "SCMP_ACT_ERRNO") return SCMP_ACT_ERRNO(errno_ret);
  if (name == "SCMP_ACT_KILL" || name == "SCMP_ACT_KILL_THREAD") return SCMP_ACT_KILL;
  if (name == "SCMP_ACT_KILL_PROCESS") return SCMP_ACT_KILL_PROCESS;
  if (name == "SCMP_ACT_TRAP") return SCMP_ACT_TRAP;
  return SCMP_ACT_ERRNO(EPERM);
}

scmp_compare Op(const std::string& op) {
  if (op == "SCMP_CMP_NE") return SCMP_CMP_NE;
  if (op == "SCMP_CMP_LT") return SCMP_CMP_LT;
  if (op == "SCMP_CMP_LE") return SCMP_CMP_LE;
  if (op == "SCMP_CMP_EQ") return SCMP_CMP_EQ;
  if (op == "SCMP_CMP_GE") return SCMP_CMP_GE;
  if (op == "SCMP_CMP_GT") return SCMP_CMP_GT;
  return SCMP_CMP_MASKED_EQ;
}

const std::set<std::string> kDockerCapSysAdmin = {
    "clone", "clone3", "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "open_tree",
    "move_mount", "mount_setattr", "fsopen", "fsmount", "fsconfig", "fspick"};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s PROFILE.json [--docker-namespace-rules] [--refuse NAME]... "
                 "[--refuse-ioctl REQUEST]...\n", argv[0]);
    return 2;
  }
  bool docker = false;
  std::set<std::string> refused;
  std::vector<unsigned long> refused_ioctls;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--docker-namespace-rules") {
      docker = true;
    } else if (a == "--refuse" && i + 1 < argc) {
      refused.insert(argv[++i]);
    } else if (a == "--refuse-ioctl" && i + 1 < argc) {
      refused_ioctls.push_back(std::strtoul(argv[++i], nullptr, 0));
    } else {
      std::fprintf(stderr, "unknown argument: %s\n", a.c_str());
      return 2;
    }
  }
  if (!refused_ioctls.empty()) refused.insert("ioctl");
  std::ifstream in(argv[1]);
  if (!in) {
    std::fprintf(stderr, "%s: cannot open: %s\n", argv[1], std::strerror(errno));
    return 1;
  }
  const json profile = json::parse(in);
  const int default_errno = docker ? EPERM : profile.value("defaultErrnoRet", EPERM);
  scmp_filter_ctx ctx = seccomp_init(Action(profile.value("defaultAction", "SCMP_ACT_ERRNO"), default_errno));
  if (ctx == nullptr) return 1;
  // bwrap sets no_new_privs itself; the filter must not ask the kernel for it twice.
  seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0);
  for (const auto& e : profile["syscalls"]) {
    if (!Applies(e)) continue;
    std::vector<std::string> names;
    if (e.contains("names")) names = e["names"].get<std::vector<std::string>>();
    if (e.contains("name")) names.push_back(e["name"].get<std::string>());
    const uint32_t action = Action(e.value("action", "SCMP_ACT_ALLOW"), e.value("errnoRet", default_errno));
    std::vector<scmp_arg_cmp> args;
    if (e.contains("args") && e["args"].is_array()) {
      for (const auto& a : e["args"]) {
        args.push_back({a.value("index", 0u), Op(a.value("op", "")), a.value("value", uint64_t{0}),
                        a.value("valueTwo", uint64_t{0})});
      }
    }
    for (const auto& n : names) {
      if (docker && kDockerCapSysAdmin.count(n)) continue;
      if (refused.count(n)) continue;
      const int nr = seccomp_syscall_resolve_name(n.c_str());
      if (nr == __NR_SCMP_ERROR) continue;  // not on this architecture
      if (action == SCMP_ACT_ERRNO(default_errno) && args.empty()) continue;
      // Duplicates and conflicts (one syscall in two entries) keep the first.
      (void)seccomp_rule_add_array(ctx, action, nr, static_cast<unsigned>(args.size()), args.data());
    }
  }
  if (docker) {
    seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, 0x7E020000, 0));
    seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  }
  for (const auto& n : refused) {
    if (n == "ioctl" && !refused_ioctls.empty()) continue;
    const int nr = seccomp_syscall_resolve_name(n.c_str());
    if (nr != __NR_SCMP_ERROR) seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), nr, 0);
  }
  if (!refused_ioctls.empty()) {
    // Every other request stays allowed, as the profile has it.
    std::vector<scmp_arg_cmp> others;
    for (unsigned long req : refused_ioctls) {
      seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1, SCMP_A1(SCMP_CMP_EQ, req));
      others.push_back(SCMP_A1(SCMP_CMP_NE, req));
    }
    seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, SCMP_SYS(ioctl), static_cast<unsigned>(others.size()), others.data());
  }
  const int rc = seccomp_export_bpf(ctx, STDOUT_FILENO);
  seccomp_release(ctx);
  if (rc != 0) {
    std::fprintf(stderr, "seccomp_export_bpf: %s\n", std::strerror(-rc));
    return 1;
  }
  return 0;
}
