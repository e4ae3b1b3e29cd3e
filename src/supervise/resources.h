// The supervisor's side of resource limits: the run's cgroup, and what it
// tells after the run (usage, OOM kills, the limits that were in force).
#pragma once

#include <memory>

#include "agentbox/outcome.h"
#include "agentbox/plan.h"
#include "agentbox/status.h"
#include "linux/cgroups.h"

namespace agentbox::supervise {

// The run's cgroup, or null when the plan asks for no cgroup-backed limit
// (then nothing is created and nothing is paid). Stale cgroups of dead
// supervisors under ours are removed on the way.
[[nodiscard]] Result<std::unique_ptr<linux::SandboxCgroup>> MakeRunCgroup(const Plan& plan);

// Fills usage from the cgroup's counters (where it has them; rusage stays
// for the rest) and records the limits in force.
void FillUsage(const Plan& plan, const linux::SandboxCgroup* cgroup, const linux::CgroupStats& stats,
               Usage* usage);

}  // namespace agentbox::supervise
