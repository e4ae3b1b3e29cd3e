#include "supervise/workspace_disk.h"

#include <sys/statfs.h>

#include <algorithm>

#include "linux/user_dirs.h"
#include "supervise/disk_limit.h"

namespace agentbox::supervise {

std::optional<Denial> WorkspaceOverlayFull(int layer_root, std::uint64_t cap_bytes, const std::string& target) {
  if (layer_root < 0) return std::nullopt;
  return DiskFullDenial(layer_root, cap_bytes, target);
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
  if (usage->used_bytes + DiskFullSlack(disk_bytes) < limit) return std::nullopt;
  return Denial{"resources", "write", target, DiskFullReason(disk_bytes, "EDQUOT"), "quota", 0};
}

}  // namespace agentbox::supervise
