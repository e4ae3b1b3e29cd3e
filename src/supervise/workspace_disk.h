// disk_gib and the host workspace of `agentbox run`: telling that a run
// filled the workspace's cap. A write past it fails inside the sandbox
// (ENOSPC on the overlay's tmpfs, EDQUOT under a project quota); the
// supervisor reports it as a `resources` denial naming disk_gib, read from
// the cap itself after the run, never guessed from the command's output.
//
// The denial's shape and the test for "full" are supervise/disk_limit.h's,
// shared with sessions' capped upper layers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "agentbox/outcome.h"
#include "agentbox/plan.h"
#include "agentbox/status.h"
#include "linux/project_quota.h"

namespace agentbox::supervise {

// --workspace-overlay: the upper layer's tmpfs (`layer_root`, its root
// directory) is full after the run (DiskFullDenial: statfs on the tmpfs).
std::optional<Denial> WorkspaceOverlayFull(int layer_root, std::uint64_t cap_bytes, const std::string& target);

// A project quota on the workspace for one run (plan.workspace_quota):
// set up before the launch, restored when this is destroyed (the kernel
// seam outlives the quota). Records go to WorkspaceQuotaRecordDir().
struct RunQuota {
  std::unique_ptr<linux::QuotaKernel> kernel;
  std::unique_ptr<linux::WorkspaceQuota> quota;
};
// Null members when the plan asks for none. Stale records of dead
// supervisors are restored first. Errors carry the stage "quota".
Result<RunQuota> StartWorkspaceQuota(const Plan& plan);

// <state>/quota: where quota records live.
std::string WorkspaceQuotaRecordDir();

// The project quota is spent (its use is within DiskFullSlack of the
// limit) after the run: quotactl(Q_GETQUOTA).
std::optional<Denial> WorkspaceQuotaFull(const linux::WorkspaceQuota& quota, std::uint64_t disk_bytes,
                                         const std::string& target);

}  // namespace agentbox::supervise
