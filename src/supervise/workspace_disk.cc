#include "supervise/workspace_disk.h"

#include <sys/statfs.h>

#include <algorithm>

#include "linux/user_dirs.h"
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

std::string WorkspaceQuotaRecordDir() {
  const std::string state = linux::StateDir();
  return state.empty() ? "" : state + "/quota";
}

Result<RunQuota> StartWorkspaceQuota(const Plan& plan) {
  RunQuota out;
  if (!plan.confined || !plan.workspace_quota) return out;
  const std::string records = WorkspaceQuotaRecordDir();
  if (records.empty()) {
    return Status::Error("quota", "no state directory (neither $XDG_STATE_HOME nor a home directory) to keep the "
                                  "workspace's project quota record in");
  }
  out.kernel = linux::RealQuotaKernel();
  (void)linux::CollectStaleProjectQuotas(out.kernel.get(), records);
  auto q = linux::WorkspaceQuota::Begin(out.kernel.get(), plan.workspace_source, plan.workspace_quota->device,
                                        plan.workspace_quota->bytes, records);
  if (!q.ok()) return q.status();
  out.quota = std::move(*q);
  return out;
}

std::optional<Denial> WorkspaceQuotaFull(const linux::WorkspaceQuota& quota, std::uint64_t disk_bytes,
                                         const std::string& target) {
  auto usage = quota.Usage();
  if (!usage.ok()) return std::nullopt;
  const std::uint64_t limit = quota.limit_bytes();
  if (usage->used_bytes + std::max(kFullSlackBytes, disk_bytes / 100) < limit) return std::nullopt;
  return WorkspaceDiskFullDenial(target, disk_bytes, "EDQUOT", "quota");
}

}  // namespace agentbox::supervise
