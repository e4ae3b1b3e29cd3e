#include "linux/workspace_fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "linux/project_quota.h"

namespace agentbox::linux {
namespace {

constexpr long kExt4Magic = 0xEF53;  // ext2, ext3 and ext4 alike
constexpr long kXfsMagic = 0x58465342;

std::string NameOfMagic(long magic) {
  switch (static_cast<unsigned long>(magic) & 0xffffffffUL) {
    case 0x01021994UL: return "tmpfs";
    case 0x9123683EUL: return "btrfs";
    case 0x794c7630UL: return "overlay";
    case 0x6969UL: return "nfs";
    case 0x65735546UL: return "fuse";
    case 0x2fc12fc1UL: return "zfs";
    case 0x858458f6UL: return "ramfs";
    case 0xFF534D42UL: return "cifs";
    case 0x9fa0UL: return "proc";
    default: {
      char buf[48];
      std::snprintf(buf, sizeof buf, "a filesystem of type 0x%lx", static_cast<unsigned long>(magic) & 0xffffffffUL);
      return buf;
    }
  }
}

bool HasOption(const std::string& options, const char* name) {
  std::stringstream in(options);
  std::string o;
  while (std::getline(in, o, ',')) {
    if (o == name) return true;
  }
  return false;
}

}  // namespace

MountFacts FindMount(const std::string& mountinfo, unsigned long long mnt_id) {
  std::stringstream in(mountinfo);
  std::string line;
  while (std::getline(in, line)) {
    unsigned long long id = 0;
    if (std::sscanf(line.c_str(), "%llu", &id) != 1 || id != mnt_id) continue;
    // ... optional fields ... " - " fstype source super_options
    const auto dash = line.find(" - ");
    if (dash == std::string::npos) return {};
    std::stringstream rest(line.substr(dash + 3));
    MountFacts f;
    rest >> f.fstype >> f.source >> f.super_options;
    return f;
  }
  return {};
}

WorkspaceFs ProbeWorkspaceFs(const std::string& dir) {
  WorkspaceFs out;
  struct statfs sf {};
  if (dir.empty() || statfs(dir.c_str(), &sf) != 0) return out;
  out.known = true;
  if (sf.f_type != kExt4Magic && sf.f_type != kXfsMagic) {
    out.fstype = NameOfMagic(sf.f_type);
    return out;
  }
  out.fstype = sf.f_type == kXfsMagic ? "xfs" : "ext4";
  struct statx stx {};
  std::string options;
  if (statx(AT_FDCWD, dir.c_str(), AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &stx) == 0 && (stx.stx_mask & STATX_MNT_ID)) {
    std::ifstream in("/proc/self/mountinfo");
    std::stringstream text;
    text << in.rdbuf();
    MountFacts f = FindMount(text.str(), stx.stx_mnt_id);
    if (!f.fstype.empty()) out.fstype = f.fstype;
    options = f.super_options;
    out.device = f.source;
  }
  const bool quota = HasOption(options, "prjquota") || HasOption(options, "pquota") ||
                     HasOption(options, "prjjquota");
  if (!quota) return out;  // "without project quotas"
  // Setting a project id on another's file and a quota limit both take
  // CAP_SYS_ADMIN in the initial user namespace.
  if (geteuid() != 0) {
    out.why_not = "with project quotas, but setting one needs root (CAP_SYS_ADMIN; agentbox runs as uid " +
                  std::to_string(geteuid()) + ")";
    return out;
  }
  // Mounted with the option is not enough: the quota must be on (ext4
  // needs the quota feature; a kernel without CONFIG_QUOTA has none).
  if (Status on = ProjectQuotasOn(out.device); !on.ok()) {
    out.why_not = "mounted with project quotas, but they are off (" + on.ToString() + ")";
    return out;
  }
  out.project_quota = true;
  return out;
}

}  // namespace agentbox::linux
