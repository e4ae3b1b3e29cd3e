#include "linux/landlock_ruleset.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "linux/compat.h"
#include "linux/fd.h"

namespace agentbox::linux {
namespace {

constexpr std::uint64_t kFileRights = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE |
                                      LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_TRUNCATE |
                                      LANDLOCK_ACCESS_FS_IOCTL_DEV;

int CreateRuleset(const LandlockRulesetAttr* attr, std::size_t size, unsigned flags) {
  return static_cast<int>(syscall(SYS_landlock_create_ruleset, attr, size, flags));
}
int AddRule(int ruleset, int parent_fd, std::uint64_t access) {
  struct landlock_path_beneath_attr pb {};
  pb.allowed_access = access;
  pb.parent_fd = parent_fd;
  return static_cast<int>(syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &pb, 0));
}
int AddPortRule(int ruleset, std::uint64_t access, std::uint16_t port) {
  LandlockNetPortAttr np{access, port};
  return static_cast<int>(syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_NET_PORT, &np, 0));
}
int RestrictSelf(int ruleset) { return static_cast<int>(syscall(SYS_landlock_restrict_self, ruleset, 0)); }

// The rights the kernel knows at `abi` (the same table the planner uses).
std::uint64_t KnownRights(int abi) {
  std::uint64_t r = (LANDLOCK_ACCESS_FS_MAKE_SYM << 1) - 1;
  if (abi >= 2) r |= LANDLOCK_ACCESS_FS_REFER;
  if (abi >= 3) r |= LANDLOCK_ACCESS_FS_TRUNCATE;
  if (abi >= 5) r |= LANDLOCK_ACCESS_FS_IOCTL_DEV;
  return r;
}

}  // namespace

int LandlockAbiVersion() {
  int abi = CreateRuleset(nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  return abi > 0 ? abi : 0;
}

Result<LandlockOutcome> ApplyLandlock(const LandlockPlan& plan) {
  LandlockOutcome out;
  out.abi = LandlockAbiVersion();
  if (plan.abi == 0) return out;
  // The plan was written for the host that planned it; `wrap` may run it on
  // another kernel. Ask only for what this one knows, and say what is lost.
  const std::uint64_t handled = plan.handled_fs & (out.abi > 0 ? KnownRights(out.abi) : 0);
  const std::uint64_t scoped = out.abi >= 6 ? plan.scoped : 0;
  const std::uint64_t handled_net = out.abi >= 4 ? plan.handled_net : 0;
  if (out.abi == 0) {
    out.short_of_plan.push_back("Landlock is unavailable on this kernel");
    return out;
  }
  if (std::uint64_t lost = plan.handled_fs & ~handled) out.short_of_plan.push_back("rights " + LandlockAccessNames(lost));
  if (plan.scoped & ~scoped) out.short_of_plan.push_back("scoping of abstract unix sockets and signals");
  if (plan.handled_net & ~handled_net) out.short_of_plan.push_back("TCP connect and bind (ABI 4)");
  if (!(handled & LANDLOCK_ACCESS_FS_REFER)) {
    // Without refer every cross-directory rename fails: do not apply half a layer that breaks work.
    out.short_of_plan.push_back("the refer right (ABI 2); the layer was not applied");
    return out;
  }

  LandlockRulesetAttr attr{};
  attr.handled_access_fs = handled;
  attr.scoped = scoped;
  attr.handled_access_net = handled_net;  // ports without a rule below are refused
  // Older kernels reject a size with fields they do not know only when those are non-zero.
  UniqueFd ruleset(CreateRuleset(&attr, sizeof(attr), 0));
  if (!ruleset.valid()) return Status::Errno("landlock", "landlock_create_ruleset");
  auto add = [&](int fd, std::uint64_t access, const std::string& path) -> Status {
    struct stat st {};
    if (fstat(fd, &st) != 0) return Status::Errno("landlock", "fstat", path);
    // Directory rights on a file are EINVAL: a file gets the file rights only.
    if (!S_ISDIR(st.st_mode)) access &= kFileRights;
    access &= handled;
    if (access == 0) return {};
    if (AddRule(ruleset.get(), fd, access) != 0) return Status::Errno("landlock", "landlock_add_rule", path);
    return {};
  };
  for (const auto& rule : plan.rules) {
    UniqueFd fd(open(rule.path.c_str(), O_PATH | O_CLOEXEC));
    if (!fd.valid()) {
      if (errno == ENOENT && rule.optional) continue;
      return Status::Errno("landlock", "open(O_PATH)", rule.path);
    }
    if (Status s = add(fd.get(), rule.access, rule.path); !s.ok()) return s;
  }
  if (handled_net & LANDLOCK_ACCESS_NET_CONNECT_TCP) {
    for (std::uint16_t port : plan.connect_tcp_ports) {
      if (AddPortRule(ruleset.get(), LANDLOCK_ACCESS_NET_CONNECT_TCP, port) != 0) {
        return Status::Errno("landlock", "landlock_add_rule(LANDLOCK_RULE_NET_PORT, " + std::to_string(port) + ")");
      }
    }
  }
  // Stdio that is a file or device outside the rules (a host terminal, a
  // file the caller redirected to) stays reopenable through /dev/stdout and
  // friends, with the access it was opened with. Pipes and sockets need no
  // rule: Landlock does not check them.
  for (int fd = 0; fd <= 2; ++fd) {
    struct stat st {};
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISCHR(st.st_mode))) continue;
    std::uint64_t access = 0;
    if ((flags & O_ACCMODE) != O_WRONLY) access |= LANDLOCK_ACCESS_FS_READ_FILE;
    if ((flags & O_ACCMODE) != O_RDONLY) access |= LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_TRUNCATE;
    if (S_ISCHR(st.st_mode)) access |= LANDLOCK_ACCESS_FS_IOCTL_DEV;
    // Best effort: a descriptor Landlock cannot name only loses the reopening.
    if (Status s = add(fd, access, "fd " + std::to_string(fd)); !s.ok()) continue;
  }
  // no_new_privs is already set (DropAllCapabilities): required by the kernel.
  if (RestrictSelf(ruleset.get()) != 0) return Status::Errno("landlock", "landlock_restrict_self");
  out.enforced = true;
  return out;
}

namespace {

// A layer for scopes or the network only. Every layer denies REFER (renames
// and links across directories, EXDEV) unless one of its rules grants it,
// whether it handles REFER or not: such a layer grants it everywhere, so
// that the layer below alone decides about files.
Result<UniqueFd> LayerWithoutFileRules(LandlockRulesetAttr attr, const char* what) {
  attr.handled_access_fs = LANDLOCK_ACCESS_FS_REFER;
  UniqueFd fd(CreateRuleset(&attr, sizeof(attr), 0));
  if (!fd.valid()) return Status::Errno("landlock", std::string("landlock_create_ruleset(") + what + ")");
  UniqueFd root(open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return Status::Errno("landlock", "open(O_PATH)", "/");
  if (AddRule(fd.get(), root.get(), LANDLOCK_ACCESS_FS_REFER) != 0) {
    return Status::Errno("landlock", "landlock_add_rule(REFER)", "/");
  }
  return fd;
}

}  // namespace

Result<UniqueFd> SignalScopeRuleset() {
  if (LandlockAbiVersion() < 6) return UniqueFd();
  LandlockRulesetAttr attr{};
  attr.scoped = LANDLOCK_SCOPE_SIGNAL;
  return LayerWithoutFileRules(attr, "LANDLOCK_SCOPE_SIGNAL");
}

Result<UniqueFd> NoNetworkRuleset() {
  const int abi = LandlockAbiVersion();
  if (abi < 4) return UniqueFd();
  LandlockRulesetAttr attr{};
  attr.handled_access_net = LANDLOCK_ACCESS_NET_BIND_TCP | LANDLOCK_ACCESS_NET_CONNECT_TCP;  // no port rule: none
  if (abi >= 6) attr.scoped = LANDLOCK_SCOPE_SIGNAL | LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET;
  return LayerWithoutFileRules(attr, "no network");
}

int RestrictSelfTo(int ruleset) { return RestrictSelf(ruleset); }

}  // namespace agentbox::linux
