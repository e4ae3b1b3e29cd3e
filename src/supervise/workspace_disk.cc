#include "supervise/workspace_disk.h"

#include <sys/statfs.h>

#include <algorithm>

#include "policy/checks.h"

namespace agentbox::supervise {

Denial WorkspaceDiskFullDenial(const std::string& target, std::uint64_t cap_bytes, const char* errno_name,
                               const char* source) {
  Denial d;
  d.facet = "resources";
  d.op = "write";
  d.target = target;
  d.reason = "disk_gib: the workspace's " + policy_internal::FormatSize(cap_bytes) + " is full (" + errno_name + ")";
  d.source = source;
  return d;
}

std::optional<Denial> WorkspaceOverlayFull(int layer_root, std::uint64_t cap_bytes, const std::string& target) {
  struct statfs st {};
  if (layer_root < 0 || fstatfs(layer_root, &st) != 0) return std::nullopt;
  const std::uint64_t left = static_cast<std::uint64_t>(st.f_bavail) * static_cast<std::uint64_t>(st.f_bsize);
  if (left >= std::max(kFullSlackBytes, cap_bytes / 100)) return std::nullopt;
  return WorkspaceDiskFullDenial(target, cap_bytes, "ENOSPC", "statfs");
}

}  // namespace agentbox::supervise
